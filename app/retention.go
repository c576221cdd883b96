package app

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// RetentionInput returns the input of the retention workflow for the retention settings r
// (with defaults filled).
func RetentionInput(r config.Retention) workflows.RetentionInput {
	return workflows.RetentionInput{
		SentAfter:      time.Duration(r.SentAfter),
		DiscardedAfter: time.Duration(r.DiscardedAfter),
		Archive:        r.Archive,
		BatchSize:      r.BatchSize,
	}
}

// PurgeOptions returns the store's purge options for the retention settings r (with
// defaults filled), for running retention without Temporal.
func PurgeOptions(r config.Retention) store.PurgeOptions {
	return store.PurgeOptions{
		SentAfter:      time.Duration(r.SentAfter),
		DiscardedAfter: time.Duration(r.DiscardedAfter),
		Archive:        r.Archive,
		Limit:          r.BatchSize,
	}
}

// EnsureRetentionSchedule creates or updates the Temporal Schedule outbox-retention from
// the config's retention settings.
func (a *App) EnsureRetentionSchedule(ctx context.Context) error {
	r := a.Config.Retention
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := worker.EnsureRetentionSchedule(ctx, a.Temporal, a.Config.Temporal.TaskQueue, RetentionInput(r), time.Duration(r.Interval)); err != nil {
		return fmt.Errorf("retention.enabled: %w", err)
	}
	cmp.Or(a.Logger, slog.Default()).InfoContext(ctx, "Retention schedule in place", slog.String("schedule_id", workflows.RetentionScheduleID),
		slog.Duration("interval", time.Duration(r.Interval)), slog.Duration("sent_after", time.Duration(r.SentAfter)),
		slog.Duration("discarded_after", time.Duration(r.DiscardedAfter)), slog.Bool("archive", r.Archive))
	return nil
}
