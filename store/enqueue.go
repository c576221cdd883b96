package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-go/outbox/internal/tracing"
	"github.com/outbox-go/outbox/store/storedriver"
)

// Validate checks msg against the store's limits and returns a *ValidationError naming the
// first field that is wrong.
func (s *Store) Validate(msg Message) error {
	return storedriver.Validate(msg, s.cfg.MaxPayloadBytes)
}

// enqueuePlainSQL is Enqueue's INSERT of a message with neither an ordering key nor an
// idempotency key, most messages: the columns it leaves out are NULL either way, and
// without an ordering key there is no ordering_seq to return.
const enqueuePlainSQL = `INSERT INTO %s (message_id, topic, payload, headers, max_retry_times, next_retry_at)
VALUES ($1, $2, $3, $4, $5, $6)`

// enqueueSQL is Enqueue's INSERT of a message with an ordering key and no idempotency key.
//
// Only a message with an idempotency key needs ON CONFLICT (enqueueIdempotentSQL). The
// clause makes PostgreSQL insert speculatively, whatever the row: it builds the arbiter's
// unique-check state, takes and releases a speculative-insertion lock in the shared lock
// table, and writes a second WAL record to confirm the row. A row without a key cannot
// conflict on the key's partial index, so that work is skipped. The statements write the
// same row.
const enqueueSQL = `INSERT INTO %s (message_id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING ordering_seq`

// enqueueIdempotentSQL is Enqueue's INSERT of a message with an idempotency key: a row
// that holds the key already makes it write nothing and return no row.
const enqueueIdempotentSQL = `INSERT INTO %s (message_id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ordering_seq`

// byIdempotencyKeySQL finds the messages that hold idempotency keys.
const byIdempotencyKeySQL = `SELECT idempotency_key, message_id FROM %s WHERE idempotency_key = ANY($1)`

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

// EnqueueJSON is EnqueueMessage with v, marshalled with encoding/json, as msg's payload:
//
//	res, err := st.EnqueueJSON(ctx, tx, store.Message{Topic: "order.created", IdempotencyKey: "order-42-created"}, order)
//
// A value that does not marshal, or a msg that sets Payload too, returns a
// *ValidationError and writes nothing.
func (s *Store) EnqueueJSON(ctx context.Context, db DB, msg Message, v any) (Enqueued, error) {
	if msg.Payload != nil {
		return Enqueued{}, &ValidationError{Field: "payload", Reason: "is set, and EnqueueJSON sets it from its value: leave Message.Payload empty"}
	}
	payload, err := json.Marshal(v)
	if err != nil {
		return Enqueued{}, &ValidationError{Field: "payload", Reason: fmt.Sprintf("cannot be marshalled from a %T: %v", v, err)}
	}
	msg.Payload = payload
	return s.EnqueueMessage(ctx, db, msg)
}

// EnqueueMessage is Enqueue that also returns the message's ordering sequence number.
//
// A message with an ordering key takes the key's lock until the transaction ends, so a
// second writer of the key waits here until the first commits or rolls back: keep
// transactions that enqueue ordered messages short. The lock is not a row, so the caller's
// transaction may run at any isolation level. Two transactions that enqueue the same keys
// in opposite orders (A then B, B then A) deadlock; PostgreSQL aborts one of them, and the
// error says so (see [ErrOrderingDeadlock]). [Store.EnqueueBatch] takes a batch's keys in
// one fixed order, which avoids that.
func (s *Store) EnqueueMessage(ctx context.Context, db DB, msg Message) (Enqueued, error) {
	r, err := s.prepare(ctx, msg)
	if err != nil {
		return Enqueued{}, err
	}
	id := binaryUUID(r.id)
	if r.orderingKey == nil && r.idempotencyKey == nil {
		if _, err := db.Exec(ctx, s.enqueuePlain, id, r.topic, r.payload, r.headers, r.maxRetryTimes, r.deliverAfter); err != nil {
			return Enqueued{}, enqueueError(msg.Topic, msg.OrderingKey, err)
		}
		return Enqueued{MessageID: r.id}, nil
	}
	var seq *int64
	query := s.enqueue
	if r.idempotencyKey != nil {
		query = s.enqueueIdempotent
	}
	err = db.QueryRow(ctx, query, id, r.topic, r.payload, r.headers, r.maxRetryTimes, r.deliverAfter, r.orderingKey, r.idempotencyKey).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) && r.idempotencyKey != nil {
		held, err := s.idempotencyHolders(ctx, db, []string{*r.idempotencyKey})
		if err != nil {
			return Enqueued{}, enqueueError(msg.Topic, msg.OrderingKey, err)
		}
		return Enqueued{MessageID: held[*r.idempotencyKey], Duplicate: true}, nil
	}
	if err != nil {
		return Enqueued{}, enqueueError(msg.Topic, msg.OrderingKey, err)
	}
	res := Enqueued{MessageID: r.id}
	if seq != nil {
		res.OrderingSeq = *seq
	}
	return res, nil
}

// binaryUUID is id as pgx sends it in binary where the protocol allows: a uuid.UUID is a
// driver.Valuer, which pgx sends as text for the server to parse. (A bare [16]byte would
// not encode at all under the simple protocol or QueryExecModeExec, which pools such as
// PgBouncer in transaction mode need.)
func binaryUUID(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

// binaryUUIDs is ids for a uuid[] parameter, which every query exec mode encodes: pgx
// has no plan for a slice of uuid.UUID under the simple protocol or QueryExecModeExec.
func binaryUUIDs(ids []uuid.UUID) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		out[i] = binaryUUID(id)
	}
	return out
}

// insertRow is one validated message as its row's column values.
type insertRow struct {
	id             uuid.UUID
	topic          string
	payload        string
	headers        *string // JSON text: a []byte would go as bytea under the Exec and simple protocol modes
	maxRetryTimes  *int
	deliverAfter   *time.Time // NULL: due at once
	orderingKey    *string
	idempotencyKey *string
}

// prepare validates msg and turns it into the values of its row.
func (s *Store) prepare(ctx context.Context, msg Message) (insertRow, error) {
	if err := s.Validate(msg); err != nil {
		return insertRow{}, err
	}
	r := insertRow{id: msg.MessageID, topic: msg.Topic, payload: string(msg.Payload), maxRetryTimes: msg.MaxRetryTimes}
	if r.id == uuid.Nil {
		var err error
		if r.id, err = uuid.NewV7(); err != nil {
			return insertRow{}, fmt.Errorf("new message id: %w", err)
		}
	}
	if h := tracing.Headers(ctx, s.cfg.Propagator, msg.Headers); len(h) > 0 {
		b, _ := json.Marshal(h) // a map[string]string always marshals
		text := string(b)
		r.headers = &text
	}
	if !msg.DeliverAfter.IsZero() {
		r.deliverAfter = &msg.DeliverAfter
	}
	if msg.OrderingKey != "" {
		r.orderingKey = &msg.OrderingKey
	}
	if msg.IdempotencyKey != "" {
		r.idempotencyKey = &msg.IdempotencyKey
	}
	return r, nil
}

// idempotencyHolders returns the message IDs of the rows that hold keys, as db's snapshot
// sees them.
func (s *Store) idempotencyHolders(ctx context.Context, db DB, keys []string) (map[string]uuid.UUID, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(byIdempotencyKeySQL, s.messages), keys)
	if err != nil {
		return nil, err
	}
	held := map[string]uuid.UUID{}
	var key string
	var id uuid.UUID
	_, err = pgx.ForEachRow(rows, []any{&key, &id}, func() error { held[key] = id; return nil })
	return held, err
}

// enqueueError wraps an INSERT's error with what the caller needs to act on it. The
// driver's error (*pgconn.PgError with pgx, *pq.Error with lib/pq) stays reachable with
// errors.As.
func enqueueError(topic, orderingKey string, err error) error {
	var sqlErr interface{ SQLState() string }
	if orderingKey != "" && errors.As(err, &sqlErr) && sqlErr.SQLState() == "40P01" {
		return fmt.Errorf("enqueue %s message with ordering key %q: %w (%w)", topic, orderingKey, ErrOrderingDeadlock, err)
	}
	return fmt.Errorf("enqueue %s message: %w", topic, err)
}

// EnqueueBatch validates every message and inserts them with one statement on db, in
// their order: a key's messages are numbered in the order given. It first takes the locks
// of the batch's ordering keys in one fixed order (by the keys' hashes), so two
// transactions that enqueue the same keys with EnqueueBatch never deadlock, whatever order
// their messages come in. An invalid message returns a *ValidationError naming its index,
// and nothing is written. The results are in the order of msgs.
func (s *Store) EnqueueBatch(ctx context.Context, db DB, msgs []Message) ([]Enqueued, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	var (
		ids      = make([]pgtype.UUID, len(msgs)) // see binaryUUID
		topics   = make([]string, len(msgs))
		payloads = make([]string, len(msgs))
		headers  = make([]*string, len(msgs))
		retries  = make([]*int, len(msgs))
		after    = make([]*time.Time, len(msgs))
		keys     = make([]*string, len(msgs))
		idemKeys = make([]*string, len(msgs))
		byID     = make(map[uuid.UUID]int, len(msgs))
		distinct []string
	)
	seen := map[string]bool{}
	for i, msg := range msgs {
		r, err := s.prepare(ctx, msg)
		if err != nil {
			var verr *ValidationError
			if errors.As(err, &verr) {
				return nil, &ValidationError{Field: fmt.Sprintf("messages[%d].%s", i, verr.Field), Reason: verr.Reason}
			}
			return nil, err
		}
		if _, dup := byID[r.id]; dup {
			return nil, &ValidationError{Field: fmt.Sprintf("messages[%d].message_id", i), Reason: fmt.Sprintf("repeats %s, which an earlier message of the batch has", r.id)}
		}
		byID[r.id] = i
		ids[i], topics[i], payloads[i], headers[i], retries[i], after[i], keys[i], idemKeys[i] = binaryUUID(r.id), r.topic, r.payload, r.headers, r.maxRetryTimes, r.deliverAfter, r.orderingKey, r.idempotencyKey
		if r.orderingKey != nil && !seen[*r.orderingKey] {
			seen[*r.orderingKey] = true
			distinct = append(distinct, *r.orderingKey)
		}
	}
	if len(distinct) > 0 {
		if _, err := db.Exec(ctx, lockKeysSQL, s.cfg.Schema+".outbox_messages", distinct); err != nil {
			return nil, enqueueError(topics[0], distinct[0], err)
		}
	}
	query := s.enqueueBatch
	if slices.ContainsFunc(idemKeys, func(k *string) bool { return k != nil }) {
		query = s.enqueueBatchIdempotent
	}
	rows, err := db.Query(ctx, query, ids, topics, payloads, headers, retries, after, keys, idemKeys)
	if err != nil {
		return nil, fmt.Errorf("enqueue %d messages: %w", len(msgs), err)
	}
	out := make([]Enqueued, len(msgs))
	written := make([]bool, len(msgs))
	var id uuid.UUID
	var seq *int64
	_, err = pgx.ForEachRow(rows, []any{&id, &seq}, func() error {
		i := byID[id]
		out[i], written[i] = Enqueued{MessageID: id}, true
		if seq != nil {
			out[i].OrderingSeq = *seq
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("enqueue %d messages: %w", len(msgs), err)
	}
	// A message not written had an idempotency key a row already held (possibly one
	// written by this very batch).
	var dupKeys []string
	for i, ok := range written {
		if !ok {
			dupKeys = append(dupKeys, *idemKeys[i])
		}
	}
	if len(dupKeys) > 0 {
		held, err := s.idempotencyHolders(ctx, db, dupKeys)
		if err != nil {
			return nil, fmt.Errorf("enqueue %d messages: %w", len(msgs), err)
		}
		for i, ok := range written {
			if !ok {
				out[i] = Enqueued{MessageID: held[*idemKeys[i]], Duplicate: true}
			}
		}
	}
	return out, nil
}

// lockKeysSQL takes the ordering locks of a batch's keys in the order of their hashes, the
// locks the insert trigger takes per row (it takes them again, which a transaction may).
const lockKeysSQL = `SELECT count(pg_advisory_xact_lock(hashtext($1), h))
FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest($2::text[]) AS k ORDER BY 1) AS keys`

// enqueueBatchSQL is EnqueueBatch's INSERT when no message of the batch has an
// idempotency key, and enqueueBatchIdempotentSQL when one has (see enqueueSQL).
const enqueueBatchSQL = `INSERT INTO %s (message_id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key)
SELECT id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key
FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::int[], $6::timestamptz[], $7::text[], $8::text[])
     WITH ORDINALITY AS m(id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key, n)
ORDER BY n
RETURNING message_id, ordering_seq`

const enqueueBatchIdempotentSQL = `INSERT INTO %s (message_id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key)
SELECT id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key
FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::int[], $6::timestamptz[], $7::text[], $8::text[])
     WITH ORDINALITY AS m(id, topic, payload, headers, max_retry_times, next_retry_at, ordering_key, idempotency_key, n)
ORDER BY n
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING message_id, ordering_seq`

// Enqueue validates msg and inserts it into public.outbox_messages with the default payload
// limit; see [Store.Enqueue]. Use a Store for another schema or limit.
func Enqueue(ctx context.Context, db DB, msg Message) (uuid.UUID, error) {
	s, _ := New(nil, Config{}) // the default config is valid
	return s.Enqueue(ctx, db, msg)
}

// The earliest "deliver not before" time still ahead of a row the claim could take, as a
// wait in microseconds from the database clock's now. It reads
// outbox_messages_claim_delayed_idx, whose predicate the conditions repeat, and min()
// becomes one probe of the index. A parked row is left out: the claim does not take it
// until it is put back.
const nextDueSQL = `SELECT ceil(EXTRACT(EPOCH FROM min(next_retry_at) - now()) * 1000000)::bigint
FROM %s
WHERE status IN ('pending', 'claimed') AND next_retry_at IS NOT NULL AND NOT held_back
  AND next_retry_at > now()`

// NextDue reports how long it is until the earliest pending message whose next_retry_at
// (its "deliver not before" time) is still ahead falls due; ok is false when there is no
// such message. The wait is computed by the database, min(next_retry_at) - now(), so the
// caller's clock does not matter. Messages already due are not counted: the claim takes
// them.
func (s *Store) NextDue(ctx context.Context) (wait time.Duration, ok bool, err error) {
	var micros *int64
	if err := s.db.QueryRow(ctx, fmt.Sprintf(nextDueSQL, s.messages)).Scan(&micros); err != nil {
		return 0, false, fmt.Errorf("find next due message: %w", err)
	}
	if micros == nil {
		return 0, false, nil
	}
	return time.Duration(*micros) * time.Microsecond, true, nil
}
