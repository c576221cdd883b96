package teamactivity

import (
	"context"
	"errors"

	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
)

// ApplicationError returns a handler's error as the ApplicationError the delivery
// workflow reads: its kind as the type (delivery.ErrTypePermanent, not retryable;
// ErrTypeRetryable; ErrTypeAmbiguous) and its RetryAfter as the NextRetryDelay. An
// ApplicationError (a handler that speaks Temporal already) is returned as it is; nil
// stays nil. The result is never wrapped: wrapping would lose NonRetryable and
// NextRetryDelay.
func ApplicationError(err error) error {
	if err == nil {
		return nil
	}
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) {
		return appErr
	}
	var e *delivery.Error
	if !errors.As(err, &e) {
		return temporal.NewApplicationError(err.Error(), delivery.ErrTypeAmbiguous)
	}
	switch e.Kind {
	case delivery.KindPermanent:
		return temporal.NewNonRetryableApplicationError(err.Error(), delivery.ErrTypePermanent, nil)
	case delivery.KindRetryable:
		return temporal.NewApplicationErrorWithOptions(err.Error(), delivery.ErrTypeRetryable,
			temporal.ApplicationErrorOptions{NextRetryDelay: e.RetryAfter})
	default:
		return temporal.NewApplicationErrorWithOptions(err.Error(), delivery.ErrTypeAmbiguous,
			temporal.ApplicationErrorOptions{NextRetryDelay: e.RetryAfter})
	}
}

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
