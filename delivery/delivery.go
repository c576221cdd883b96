// Package delivery is the one contract between the outbox and whatever delivers its
// messages: the [Message] a delivery gets, the [Handler] that delivers it, and the way a
// handler says what its failure means ([Permanent], [Retryable], [Ambiguous], with an
// HTTP Retry-After through [ParseRetryAfter]). The outbox's own sinks (sinks/httpsink,
// sinks/natssink, sinks/rabbitsink, sinks/kafkasink) are Handlers, a Go handler compiled
// into the outbox's worker is one, and a team's own Temporal activity is one too: the same
// Handler, registered in the team's worker with teamactivity.Activity (package
// sinks/teamactivity). This package depends on the standard library only.
//
// A topic configured with activity: (and task_queue:) is delivered by OutboxDelivery
// executing that activity by name on that task queue, once per attempt:
//
//	w.RegisterActivityWithOptions(teamactivity.Activity(delivery.HandlerFunc(
//		func(ctx context.Context, m delivery.Message) error {
//			var order struct{ OrderID int64 `json:"order_id"` }
//			if err := json.Unmarshal(m.Payload, &order); err != nil {
//				return delivery.Permanent(fmt.Errorf("bad payload: %w", err))
//			}
//			return reserve(ctx, order.OrderID, m.MessageID) // idempotent by m.MessageID
//		})), activity.RegisterOptions{Name: "ReserveStock"})
//
// The handler's error decides what happens next, wherever the handler runs: nil means
// the downstream has the message; a Permanent error dead-letters it at once; a Retryable
// error (the downstream did not take it) waits the topic's backoff, or the wait it names;
// an Ambiguous error, or any error not marked, means the downstream may have it, so the
// topic's check (a [Checker], or a team's check_activity) is asked before it is sent
// again. A team's activity that returns Temporal errors of its own is read as Temporal's
// retries would: a non-retryable ApplicationError dead-letters, NextRetryDelay waits,
// any other error waits the backoff; a start-to-close timeout is ambiguous; a
// schedule-to-start timeout (no worker polled the task queue in time) is retried.
//
// A check_activity takes the same Message and returns (processed bool, err error):
// register a [Checker] with teamactivity.CheckActivity.
package delivery

import (
	"encoding/json"
	"time"
)

// Message is one delivery attempt of an outbox message, as a handler receives it.
type Message struct {
	// MessageID is the message's ID (a UUID), the idempotency key the downstream
	// de-duplicates by: the same on every attempt and every run.
	MessageID string `json:"message_id"`
	// Topic is the message's topic.
	Topic string `json:"topic"`
	// Payload is the message body as written by the business transaction (JSON).
	Payload json.RawMessage `json:"payload"`
	// Headers are the message's headers (trace context, for example).
	Headers map[string]string `json:"headers,omitempty"`
	// OrderingKey is the message's ordering key; empty when it has none.
	OrderingKey string `json:"ordering_key,omitempty"`
	// Attempt counts the attempts from 1; MaxAttempts is the last one. Both are 0 when
	// a Checker is asked about the message.
	Attempt     int `json:"attempt"`
	MaxAttempts int `json:"max_attempts"`
	// CreatedAt is when the message was enqueued, by the database clock.
	CreatedAt time.Time `json:"created_at"`
}
