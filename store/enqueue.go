package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/internal/tracing"
)

// Message is what business code enqueues.
type Message struct {
	// Topic routes the message to its handler, e.g. "order.created". It must match
	// TopicPattern.
	Topic string
	// Payload is the message body: any JSON value, at most Config.MaxPayloadBytes.
	Payload json.RawMessage
	// Headers are carried with the message to its handler (trace context, for example).
	Headers map[string]string
	// MaxRetryTimes, when set, is the number of retries after the first attempt (0 to
	// 100); it overrides the topic's max_attempts. Nil uses the topic's policy.
	MaxRetryTimes *int
	// MessageID is the message's idempotency key. Zero means a new UUIDv7.
	MessageID uuid.UUID
	// OrderingKey, when set, delivers the message after every earlier committed message
	// with the same key (any topic): an order's created, paid and cancelled events in
	// commit order. At most 200 bytes. Messages without a key are never held back.
	OrderingKey string
	// DeliverAfter is the earliest time the message is delivered (its next_retry_at);
	// the relay hands it over once the database clock has passed it. Zero means now. At
	// most one year ahead; a time in the past means now.
	DeliverAfter time.Time
}

// TopicPattern is the form a topic must have.
var TopicPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// MaxRetryTimesLimit is the largest value of max_retry_times.
const MaxRetryTimesLimit = 100

// ValidationError reports a message that cannot be enqueued. Nothing was written.
type ValidationError struct {
	Field  string // "topic", "payload", "headers", "max_retry_times", "ordering_key" or "deliver_after"
	Reason string // what was wrong, with the value
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid outbox message: %s %s", e.Field, e.Reason)
}

// Validate checks msg against the store's limits and returns a *ValidationError naming the
// first field that is wrong.
func (s *Store) Validate(msg Message) error {
	return validate(msg, s.cfg.MaxPayloadBytes)
}

func validate(msg Message, maxPayload int) error {
	if !TopicPattern.MatchString(msg.Topic) {
		return &ValidationError{"topic", fmt.Sprintf("must match %s, got %s", TopicPattern, quoteShort(msg.Topic))}
	}
	if err := validatePayload(msg.Payload, maxPayload); err != nil {
		return err
	}
	for k, v := range msg.Headers {
		if k == "" || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return &ValidationError{"headers", fmt.Sprintf("must have non-empty UTF-8 keys and values without NUL characters, got %s: %s", quoteShort(k), quoteShort(v))}
		}
	}
	if k := msg.OrderingKey; len(k) > 200 || strings.ContainsRune(k, 0) || !utf8.ValidString(k) || (k != "" && strings.TrimSpace(k) == "") {
		return &ValidationError{"ordering_key", fmt.Sprintf("must be at most 200 bytes of text, not blank and without NUL, got %s", quoteShort(k))}
	}
	if r := msg.MaxRetryTimes; r != nil && (*r < 0 || *r > MaxRetryTimesLimit) {
		return &ValidationError{"max_retry_times", fmt.Sprintf("must be between 0 and %d, got %d", MaxRetryTimesLimit, *r)}
	}
	if t := msg.DeliverAfter; !t.IsZero() {
		now := time.Now()
		if t.After(now.AddDate(1, 0, 0)) {
			return &ValidationError{"deliver_after", fmt.Sprintf("must be at most 1 year ahead, got %s (%s from now)",
				t.Format(time.RFC3339), t.Sub(now).Round(time.Second))}
		}
	}
	return nil
}

// ValidatePayload checks that p is one JSON value of at most maxBytes bytes that
// PostgreSQL's jsonb can store: UTF-8, no \u0000 and no lone UTF-16 surrogate escape in
// any string, and numbers within the range of numeric.
func ValidatePayload(p []byte, maxBytes int) error { return validatePayload(p, maxBytes) }

func validatePayload(p []byte, maxBytes int) error {
	if len(bytes.TrimSpace(p)) == 0 {
		return &ValidationError{"payload", "must be a JSON value, got nothing"}
	}
	if len(p) > maxBytes {
		return &ValidationError{"payload", fmt.Sprintf("must be at most %d bytes, got %d bytes", maxBytes, len(p))}
	}
	if !utf8.Valid(p) {
		return &ValidationError{"payload", "must be UTF-8 text, got invalid UTF-8"}
	}
	if !json.Valid(p) {
		return &ValidationError{"payload", fmt.Sprintf("must be valid JSON, got %s", quoteShort(string(p)))}
	}
	return checkJSONForJSONB(p)
}

// checkJSONForJSONB walks valid JSON text once for what jsonb refuses although JSON allows
// it.
func checkJSONForJSONB(p []byte) error {
	bad := func(format string, args ...any) error {
		return &ValidationError{"payload", fmt.Sprintf(format, args...)}
	}
	inString := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if inString {
			switch c {
			case '"':
				inString = false
			case '\\':
				i++
				if p[i] != 'u' {
					continue
				}
				r := hex4(p[i+1 : i+5])
				i += 4
				switch {
				case r == 0:
					return bad(`must not contain \u0000 (PostgreSQL jsonb cannot store it), found at byte %d`, i-5)
				case r >= 0xD800 && r < 0xDC00:
					if i+6 < len(p) && p[i+1] == '\\' && p[i+2] == 'u' {
						if low := hex4(p[i+3 : i+7]); low >= 0xDC00 && low < 0xE000 {
							i += 6
							continue
						}
					}
					return bad(`must not contain a lone UTF-16 surrogate escape (\u%04x at byte %d): PostgreSQL jsonb refuses it`, r, i-5)
				case r >= 0xDC00 && r < 0xE000:
					return bad(`must not contain a lone UTF-16 surrogate escape (\u%04x at byte %d): PostgreSQL jsonb refuses it`, r, i-5)
				}
			}
			continue
		}
		switch {
		case c == '"':
			inString = true
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(p) && strings.IndexByte("0123456789+-.eE", p[j]) >= 0 {
				j++
			}
			if !numericFits(p[i:j]) {
				return bad("number %s is outside the range PostgreSQL's jsonb can store", quoteShort(string(p[i:j])))
			}
			i = j - 1
		}
	}
	return nil
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		}
	}
	return r
}

// numericFits reports whether a JSON number fits PostgreSQL's numeric: at most 131072
// digits before the decimal point and 16383 after it.
func numericFits(num []byte) bool {
	s := strings.TrimPrefix(string(num), "-")
	mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	intPart = strings.TrimLeft(intPart, "0")
	if strings.Trim(intPart+frac, "0") == "" {
		return true // zero, whatever the exponent
	}
	e := 0
	if exp != "" {
		v, err := strconv.Atoi(exp)
		if err != nil || v > 1_000_000 || v < -1_000_000 {
			return false
		}
		e = v
	}
	before := len(intPart) + e
	if intPart == "" { // 0.000123: leading zeros of the fraction do not count
		before = e - (len(frac) - len(strings.TrimLeft(frac, "0")))
	}
	after := len(strings.TrimRight(frac, "0")) - e
	return before <= 131072 && after <= 16383
}

func quoteShort(s string) string {
	const max = 80
	if len(s) > max {
		return fmt.Sprintf("%q... (%d bytes)", s[:max], len(s))
	}
	return fmt.Sprintf("%q", s)
}

const enqueueSQL = `INSERT INTO %s (message_id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING ordering_seq`

// Enqueued is what EnqueueMessage wrote.
type Enqueued struct {
	MessageID uuid.UUID
	// OrderingSeq is the message's place among the messages of its ordering key (1, 2,
	// ...), in commit order; 0 without a key.
	OrderingSeq int64
}

// Enqueue validates msg and inserts it as a pending row with one INSERT on db, which is
// normally the caller's business transaction (a pgx.Tx): the message commits or rolls
// back with the business rows. It returns the message ID, the idempotency key every
// delivery carries. An invalid message returns a *ValidationError and writes nothing.
//
// When ctx carries a span, its trace context (traceparent and tracestate; see
// Config.Propagator) is added to the message's headers, so the send continues the trace;
// headers that msg sets itself are kept.
//
// A message with msg.DeliverAfter set is delivered once that time has passed (see
// [Store.NextDue]); the row is written now, so it still commits or rolls back with the
// business rows.
func (s *Store) Enqueue(ctx context.Context, db DB, msg Message) (uuid.UUID, error) {
	res, err := s.EnqueueMessage(ctx, db, msg)
	return res.MessageID, err
}

// EnqueueMessage is Enqueue that also returns the message's ordering sequence number. A
// writer of a key waits here while another open transaction holds the key's previous
// number, so keep transactions that enqueue ordered messages short.
func (s *Store) EnqueueMessage(ctx context.Context, db DB, msg Message) (Enqueued, error) {
	if err := s.Validate(msg); err != nil {
		return Enqueued{}, err
	}
	id := msg.MessageID
	if id == uuid.Nil {
		var err error
		if id, err = uuid.NewV7(); err != nil {
			return Enqueued{}, fmt.Errorf("new message id: %w", err)
		}
	}
	var headers []byte
	if h := tracing.Headers(ctx, s.cfg.Propagator, msg.Headers); len(h) > 0 {
		headers, _ = json.Marshal(h) // a map[string]string always marshals
	}
	var deliverAfter *time.Time // NULL: due at once
	if !msg.DeliverAfter.IsZero() {
		deliverAfter = &msg.DeliverAfter
	}
	var orderingKey *string
	if msg.OrderingKey != "" {
		orderingKey = &msg.OrderingKey
	}
	var seq *int64
	if err := db.QueryRow(ctx, s.enqueue,
		id, msg.Topic, string(msg.Payload), headers, msg.MaxRetryTimes, deliverAfter, orderingKey).Scan(&seq); err != nil {
		return Enqueued{}, fmt.Errorf("enqueue %s message: %w", msg.Topic, err)
	}
	res := Enqueued{MessageID: id}
	if seq != nil {
		res.OrderingSeq = *seq
	}
	return res, nil
}

// Enqueue validates msg and inserts it into public.outbox_messages with the default payload
// limit; see [Store.Enqueue]. Use a Store for another schema or limit.
func Enqueue(ctx context.Context, db DB, msg Message) (uuid.UUID, error) {
	s, _ := New(nil, Config{}) // the default config is valid
	return s.Enqueue(ctx, db, msg)
}

// The earliest "deliver not before" time still ahead, as a wait in microseconds from the
// database clock's now. It reads outbox_messages_deliver_after_idx: the conditions imply
// the index predicate, and min() becomes one probe of the index.
const nextDueSQL = `SELECT ceil(EXTRACT(EPOCH FROM min(next_retry_at) - now()) * 1000000)::bigint
FROM %s
WHERE status = 'pending' AND next_retry_at IS NOT NULL AND next_retry_at > now()`

// NextDueSQL returns the statement NextDue runs, for EXPLAIN.
func (s *Store) NextDueSQL() string { return fmt.Sprintf(nextDueSQL, s.messages) }

// NextDue reports how long it is until the earliest pending message whose next_retry_at
// (its "deliver not before" time) is still ahead falls due; ok is false when there is no
// such message. The wait is computed by the database, min(next_retry_at) - now(), so the
// caller's clock does not matter. Messages already due are not counted: the claim takes
// them.
func (s *Store) NextDue(ctx context.Context) (wait time.Duration, ok bool, err error) {
	var micros *int64
	if err := s.db.QueryRow(ctx, s.NextDueSQL()).Scan(&micros); err != nil {
		return 0, false, fmt.Errorf("find next due message: %w", err)
	}
	if micros == nil {
		return 0, false, nil
	}
	return time.Duration(*micros) * time.Microsecond, true, nil
}

// Row is one outbox_messages row as the relay and the activities see it.
type Row struct {
	ID            int64
	MessageID     uuid.UUID
	Topic         string
	Payload       json.RawMessage
	Headers       map[string]string
	Status        string
	RetryTimes    int
	MaxRetryTimes *int
	NextRetryAt   *time.Time
	LastError     *string
	RedriveCount  int
	CreatedAt     time.Time
	UpdatedAt     time.Time
	SentAt        *time.Time
	OrderingKey   *string
	OrderingSeq   *int64
}
