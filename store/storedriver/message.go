package storedriver

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
)

// Status is a message's status, as stored in outbox_messages.status.
type Status string

// Message statuses.
const (
	StatusPending    Status = "pending"
	StatusClaimed    Status = "claimed"
	StatusDispatched Status = "dispatched"
	StatusSent       Status = "sent"
	StatusDead       Status = "dead"
	StatusDiscarded  Status = "discarded"
)

// Statuses lists every status in the order a message moves through them.
var Statuses = []Status{StatusPending, StatusClaimed, StatusDispatched, StatusSent, StatusDead, StatusDiscarded}

// DefaultMaxPayloadBytes is the payload size limit when Config.MaxPayloadBytes is zero.
const DefaultMaxPayloadBytes = 256 << 10

// HardMaxPayloadBytes is the largest payload limit that may be configured: Temporal refuses
// payloads of 2 MB, and an activity that hosts a topic handler receives the payload.
const HardMaxPayloadBytes = 2_000_000 - 64<<10

// ErrNotFound is returned when a message or dead letter does not exist.
var ErrNotFound = errors.New("not found")

// ErrNotMigrated is what an error wraps (errors.Is) when the database answered that the
// outbox's tables, a column of theirs or the deployment's row are missing: outbox migrate
// has not run on it, or not since the migration that adds them. Waiting does not help.
var ErrNotMigrated = errors.New("the outbox's migrations have not run on this database")

// NotMigrated returns err, with its message unchanged, as an error that also matches
// ErrNotMigrated; a store returns it for the answers ErrNotMigrated describes.
func NotMigrated(err error) error { return notMigrated{err} }

type notMigrated struct{ err error }

func (e notMigrated) Error() string        { return e.err.Error() }
func (e notMigrated) Unwrap() error        { return e.err }
func (e notMigrated) Is(target error) bool { return target == ErrNotMigrated }

// TopicPattern is the form a topic must have.
var TopicPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// MaxRetryTimesLimit is the largest value of max_retry_times.
const MaxRetryTimesLimit = 100

// MaxHeadersBytes bounds a message's headers, their keys and values together: room for
// trace context and a team's own metadata, and within what every broker sink carries
// with the outbox's own headers added (NATS JetStream takes 64 KiB of headers; a
// RabbitMQ frame, 128 KiB by default). Headers are metadata; data goes in the payload.
const MaxHeadersBytes = 32 << 10

// HeadersSize is the size of headers as MaxHeadersBytes counts it: their keys and values
// together.
func HeadersSize(headers map[string]string) int {
	n := 0
	for k, v := range headers {
		n += len(k) + len(v)
	}
	return n
}

// Message is what business code enqueues.
type Message struct {
	// Topic routes the message to its handler, e.g. "order.created". It must match
	// TopicPattern.
	Topic string
	// Payload is the message body: any JSON value, at most Config.MaxPayloadBytes.
	Payload json.RawMessage
	// Headers are carried with the message to its handler (trace context, for example):
	// at most MaxHeadersBytes of keys and values.
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
	// IdempotencyKey, when set, is a key the application chooses for the message, such as
	// "order-42-created": while a row with the key is in the table, another Enqueue with it
	// writes nothing and reports Enqueued.Duplicate, without an error, so the caller's
	// transaction goes on. At most 200 bytes of text. Retention frees a key with its row.
	IdempotencyKey string
}

// ValidationError reports a message that cannot be enqueued. Nothing was written.
type ValidationError struct {
	Field  string // "topic", "payload", "headers", "max_retry_times", "ordering_key", "deliver_after" or "idempotency_key"
	Reason string // what was wrong, with the value
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid outbox message: %s %s", e.Field, e.Reason)
}

// Enqueued is what EnqueueMessage wrote.
type Enqueued struct {
	MessageID uuid.UUID
	// OrderingSeq is the message's place among the messages of its ordering key: greater
	// than the number of every message of the key that committed before it (numbers come
	// from one sequence, so they have gaps); 0 without a key.
	OrderingSeq int64
	// Duplicate reports that a row with the message's IdempotencyKey was already in the
	// table, so nothing was written; MessageID is then that row's message ID (on MySQL,
	// zero when the caller's snapshot cannot see it, as at REPEATABLE READ when it
	// committed later). On PostgreSQL at REPEATABLE READ or SERIALIZABLE, a holder that
	// committed after the caller's snapshot is no Duplicate: the enqueue fails with a
	// serialization failure (SQLSTATE 40001), which aborts the caller's transaction, to be
	// retried as a whole as any such failure is.
	Duplicate bool
}

// ErrOrderingDeadlock is what an Enqueue error wraps when PostgreSQL aborted the
// transaction because it and another one enqueued the same ordering keys in opposite
// orders. Retry the transaction; enqueue a transaction's keyed messages with one
// EnqueueBatch call, or always in the same key order, to avoid it.
var ErrOrderingDeadlock = errors.New("two transactions enqueued the same ordering keys in opposite orders and deadlocked; the database aborted this one: retry the transaction, and enqueue a transaction's keyed messages with one EnqueueBatch call (it takes their keys in a fixed order) or always in the same key order")
