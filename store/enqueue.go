package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

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
		if k == "" || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) {
			return &ValidationError{"headers", fmt.Sprintf("must have non-empty keys and no NUL characters, got %s: %s", quoteShort(k), quoteShort(v))}
		}
	}
	if k := msg.OrderingKey; len(k) > 200 || strings.ContainsRune(k, 0) || (k != "" && strings.TrimSpace(k) == "") {
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

// ValidatePayload checks that p is one JSON value of at most maxBytes bytes with no
// \u0000 in any string (PostgreSQL's jsonb cannot store it).
func ValidatePayload(p []byte, maxBytes int) error { return validatePayload(p, maxBytes) }

func validatePayload(p []byte, maxBytes int) error {
	if len(bytes.TrimSpace(p)) == 0 {
		return &ValidationError{"payload", "must be a JSON value, got nothing"}
	}
	if len(p) > maxBytes {
		return &ValidationError{"payload", fmt.Sprintf("must be at most %d bytes, got %d bytes", maxBytes, len(p))}
	}
	if !json.Valid(p) {
		return &ValidationError{"payload", fmt.Sprintf("must be valid JSON, got %s", quoteShort(string(p)))}
	}
	// Only a \u0000 escape can put a NUL into a JSON string; look for one before the
	// slower walk that tells an escape from an escaped backslash followed by "u0000".
	if !bytes.Contains(p, []byte(`u0000`)) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(p))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return &ValidationError{"payload", fmt.Sprintf("must be valid JSON: %v", err)}
		}
		if s, ok := tok.(string); ok && strings.ContainsRune(s, 0) {
			return &ValidationError{"payload", fmt.Sprintf(`must not contain \u0000 (PostgreSQL jsonb cannot store it), found in string %s`, quoteShort(s))}
		}
	}
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
