// Package delivery is what a team's own Temporal worker imports to handle an outbox topic
// with an activity of its own: the input the outbox gives that activity. It depends on the
// standard library only.
//
// A topic configured with activity: (and task_queue:) is delivered by OutboxDelivery
// executing that activity by name on that task queue, once per attempt:
//
//	func ReserveStock(ctx context.Context, m delivery.Message) error {
//		var order struct{ OrderID int64 `json:"order_id"` }
//		if err := json.Unmarshal(m.Payload, &order); err != nil {
//			return temporal.NewNonRetryableApplicationError("bad payload", "BadPayload", err)
//		}
//		return reserve(ctx, order.OrderID, m.MessageID) // idempotent by m.MessageID
//	}
//
// The activity's error decides what happens next, as Temporal's own retries would: a
// non-retryable ApplicationError dead-letters the message at once; an ApplicationError with
// NextRetryDelay waits that long before the next attempt; any other error waits the
// topic's backoff; a start-to-close timeout is ambiguous, so the topic's check_activity (if
// any) is asked before the message is sent again; a schedule-to-start timeout (no worker
// polled the task queue in time) is retried. Each attempt is its own activity execution,
// visible in the delivery's history.
//
// A check_activity takes the same Message and returns (processed bool, err error).
package delivery

import (
	"encoding/json"
	"time"
)

// Message is the input of a topic's activity: one outbox message and the attempt.
type Message struct {
	// MessageID is the message's ID, the idempotency key the activity de-duplicates by.
	MessageID string `json:"message_id"`
	// Topic is the message's topic.
	Topic string `json:"topic"`
	// Payload is the message body as written by the business transaction (JSON).
	Payload json.RawMessage `json:"payload"`
	// Headers are the message's headers (trace context, for example).
	Headers map[string]string `json:"headers,omitempty"`
	// Attempt counts the attempts from 1; MaxAttempts is the last one.
	Attempt     int `json:"attempt"`
	MaxAttempts int `json:"max_attempts"`
	// CreatedAt is when the message was enqueued, by the database clock.
	CreatedAt time.Time `json:"created_at"`
}
