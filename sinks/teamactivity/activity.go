package teamactivity

import (
	"context"
	"errors"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks"
)

// ApplicationError returns a handler's error as the ApplicationError the delivery
// workflow reads (see sinks.ApplicationError).
func ApplicationError(err error) error { return sinks.ApplicationError(err) }

// Activity returns h as the activity a team registers in its own worker for a topic
// configured with activity: and task_queue:, so that a handler runs the same way
// compiled into the outbox's worker or in the team's: its errors reach the delivery
// workflow as ApplicationError reports them.
//
//	w.RegisterActivityWithOptions(teamactivity.Activity(h), activity.RegisterOptions{Name: "ReserveStock"})
func Activity(h delivery.Handler) func(ctx context.Context, m delivery.Message) error {
	return func(ctx context.Context, m delivery.Message) error {
		return ApplicationError(h.Send(ctx, m))
	}
}

// CheckActivity returns c as the check_activity of such a topic. A Checker that
// returns ErrCheckUnsupported answers "not processed", so the message is sent again.
func CheckActivity(c delivery.Checker) func(ctx context.Context, m delivery.Message) (bool, error) {
	return func(ctx context.Context, m delivery.Message) (bool, error) {
		processed, err := c.CheckProcessed(ctx, m)
		if errors.Is(err, delivery.ErrCheckUnsupported) {
			return false, nil
		}
		return processed, err
	}
}
