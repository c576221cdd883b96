package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.temporal.io/sdk/converter"

	"github.com/outbox-go/outbox/codec"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// EnsureRetentionSchedule creates or updates the Temporal Schedule of the config's task
// queue (workflows.RetentionScheduleFor: outbox-retention for the default task queue)
// from the config's retention settings. It reads the schedule in place through the config's
// payload codec, as DialTemporal's client writes it.
func (a *App) EnsureRetentionSchedule(ctx context.Context) error {
	if a.Temporal == nil {
		return errors.New("retention schedule: not connected to Temporal (app.Connect, or DialTemporal after app.Open)")
	}
	r := a.Config.Retention
	cdc, err := a.Config.Codec.New()
	if err != nil {
		return &ConfigError{fmt.Errorf("invalid config:\n%w", err)}
	}
	var dc converter.DataConverter
	if cdc != nil {
		dc = codec.DataConverter(cdc)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := worker.EnsureRetentionScheduleConverter(ctx, a.Temporal, dc, a.Config.Temporal.TaskQueue, r.WorkflowInput(), time.Duration(r.Interval)); err != nil {
		return fmt.Errorf("retention.enabled: %w", err)
	}
	cmp.Or(a.Logger, slog.Default()).InfoContext(ctx, "Retention schedule in place", slog.String("schedule_id", workflows.RetentionScheduleFor(a.Config.Temporal.TaskQueue)),
		slog.Duration("interval", time.Duration(r.Interval)), slog.Duration("sent_after", time.Duration(r.SentAfter)),
		slog.Duration("discarded_after", time.Duration(r.DiscardedAfter)), slog.Bool("archive", r.Archive))
	return nil
}
