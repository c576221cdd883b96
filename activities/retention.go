package activities

import (
	"context"
	"log/slog"

	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// PurgeBatch removes one batch of old rows (one short transaction, see
// [store.Store.PurgeBatch]) for the retention workflow. An input out of range fails
// without retries; a database error is retried by the workflow's retry policy.
func (a *Activities) PurgeBatch(ctx context.Context, in workflows.RetentionInput) (workflows.PurgeBatchResult, error) {
	opts := store.PurgeOptions{SentAfter: in.SentAfter, DiscardedAfter: in.DiscardedAfter, Archive: in.Archive, Limit: in.BatchSize}
	err := in.Validate()
	if err == nil {
		err = opts.Validate()
	}
	if err != nil {
		return workflows.PurgeBatchResult{}, temporal.NewNonRetryableApplicationError(
			"invalid retention input: "+err.Error(), workflows.ErrTypeInvalidRetention, nil)
	}
	res, err := a.Store.PurgeBatch(ctx, opts)
	if err != nil {
		return workflows.PurgeBatchResult{}, err
	}
	if res.SentMessages+res.DiscardedMessages+res.DeadLetters > 0 {
		a.logger().InfoContext(ctx, "Retention batch removed rows",
			slog.Int64("sent_messages", res.SentMessages), slog.Int64("discarded_messages", res.DiscardedMessages),
			slog.Int64("dead_letters", res.DeadLetters), slog.Bool("archive", in.Archive))
	}
	return workflows.PurgeBatchResult{
		SentMessages:      res.SentMessages,
		DiscardedMessages: res.DiscardedMessages,
		DeadLetters:       res.DeadLetters,
		More:              res.More,
	}, nil
}
