package app

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// EnsureRetentionSchedule creates or updates the Temporal Schedule outbox-retention from
// the config's retention settings.
func (a *App) EnsureRetentionSchedule(ctx context.Context) error {
	r := a.Config.Retention
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := worker.EnsureRetentionSchedule(ctx, a.Temporal, a.Config.Temporal.TaskQueue, r.WorkflowInput(), time.Duration(r.Interval)); err != nil {
		return fmt.Errorf("retention.enabled: %w", err)
	}
	cmp.Or(a.Logger, slog.Default()).InfoContext(ctx, "Retention schedule in place", slog.String("schedule_id", workflows.RetentionScheduleID),
		slog.Duration("interval", time.Duration(r.Interval)), slog.Duration("sent_after", time.Duration(r.SentAfter)),
		slog.Duration("discarded_after", time.Duration(r.DiscardedAfter)), slog.Bool("archive", r.Archive))
	return nil
}
