package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// EnsureRetentionSchedule makes sure the Temporal Schedule of taskQueue's outbox
// ([workflows.RetentionScheduleFor]: outbox-retention for the default task queue
// "outbox", outbox-retention-<task queue> for another) exists and starts OutboxRetention
// with in on taskQueue every interval, skipping a start while the previous run is still
// going. It creates the schedule, or, when it exists already (another worker created it,
// or an earlier config did), updates its spec and action to these if they differ. The
// schedule's state is left as it is, so a schedule paused in the Temporal UI stays paused.
// Several workers may call it at once.
//
// Earlier releases named every task queue's schedule outbox-retention, so the outboxes
// of one namespace took it from each other. For another task queue than the default, a
// schedule outbox-retention that starts on taskQueue is this outbox's: the new schedule
// is created paused when it was paused, and it is deleted.
//
// The existing schedule's argument is read with the SDK's default data converter; a client
// that encodes payloads with a codec uses EnsureRetentionScheduleConverter instead, or
// every call finds an argument it cannot read and updates the schedule.
func EnsureRetentionSchedule(ctx context.Context, c client.Client, taskQueue string, in workflows.RetentionInput, every time.Duration) error {
	return EnsureRetentionScheduleConverter(ctx, c, nil, taskQueue, in, every)
}

// EnsureRetentionScheduleConverter is EnsureRetentionSchedule for a client whose data
// converter is dc (client.Options.DataConverter, codec.DataConverter for the outbox's
// payload codec): it reads the existing schedule's argument with dc, so an unchanged
// schedule is left alone. A nil dc is the SDK's default data converter.
func EnsureRetentionScheduleConverter(ctx context.Context, c client.Client, dc converter.DataConverter, taskQueue string, in workflows.RetentionInput, every time.Duration) error {
	taskQueue = cmp.Or(taskQueue, workflows.DefaultTaskQueue)
	id := workflows.RetentionScheduleFor(taskQueue)
	if dc == nil {
		dc = converter.GetDefaultDataConverter()
	}
	if err := in.Validate(); err != nil {
		return fmt.Errorf("retention schedule %s: %w", id, err)
	}
	// The limits the config file's retention keys have, which the purge activity holds
	// each run to: a schedule beyond them would fail every run.
	switch {
	case in.SentAfter < store.MinRetentionAge:
		return fmt.Errorf("retention schedule %s: sent_after must be at least %s, got %s", id, store.MinRetentionAge, in.SentAfter)
	case in.DiscardedAfter < store.MinRetentionAge:
		return fmt.Errorf("retention schedule %s: discarded_after must be at least %s, got %s", id, store.MinRetentionAge, in.DiscardedAfter)
	case in.BatchSize > store.MaxPurgeLimit:
		return fmt.Errorf("retention schedule %s: batch_size must be at most %d, got %d", id, store.MaxPurgeLimit, in.BatchSize)
	case every < time.Minute:
		return fmt.Errorf("retention schedule %s: interval must be at least 1m, got %s", id, every)
	}
	spec := client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: every}}}
	action := &client.ScheduleWorkflowAction{
		ID:        id,
		Workflow:  workflows.RetentionWorkflowType,
		Args:      []any{in},
		TaskQueue: taskQueue,
	}
	schedules := c.ScheduleClient()
	legacy, legacyState := earlierSchedule(ctx, schedules, id, taskQueue)
	_, err := schedules.Create(ctx, client.ScheduleOptions{
		ID:      id,
		Spec:    spec,
		Action:  action,
		Overlap: enumspb.SCHEDULE_OVERLAP_POLICY_SKIP,
		Paused:  legacyState.Paused,
		Note:    legacyState.Note,
	})
	var exists *serviceerror.AlreadyExists
	switch {
	case err == nil:
		if legacy != nil {
			// Ours now runs retention for this database; a failed delete leaves a second
			// schedule of the same purge, which the next start deletes.
			_ = legacy.Delete(ctx)
		}
		return nil
	case !errors.Is(err, temporal.ErrScheduleAlreadyRunning) && !errors.As(err, &exists):
		return fmt.Errorf("create retention schedule %s: %w", id, err)
	}
	if legacy != nil {
		_ = legacy.Delete(ctx)
	}
	err = schedules.GetHandle(ctx, id).Update(ctx, client.ScheduleUpdateOptions{
		DoUpdate: func(cur client.ScheduleUpdateInput) (*client.ScheduleUpdate, error) {
			s := cur.Description.Schedule
			if sameRetentionSchedule(s, spec, action, in, dc) {
				return nil, temporal.ErrSkipScheduleUpdate
			}
			s.Spec, s.Action = &spec, action
			policy := client.SchedulePolicies{}
			if s.Policy != nil {
				policy = *s.Policy
			}
			policy.Overlap = enumspb.SCHEDULE_OVERLAP_POLICY_SKIP
			s.Policy = &policy
			return &client.ScheduleUpdate{Schedule: &s}, nil
		},
	})
	if err != nil {
		return fmt.Errorf("update retention schedule %s: %w", id, err)
	}
	return nil
}

// earlierSchedule returns the schedule outbox-retention when an earlier release made it
// for taskQueue's outbox (whose schedule is now id), with its state; nil when there is
// none, or it is another outbox's, or it cannot be read (the next start looks again).
func earlierSchedule(ctx context.Context, schedules client.ScheduleClient, id, taskQueue string) (client.ScheduleHandle, client.ScheduleState) {
	if id == workflows.RetentionScheduleID {
		return nil, client.ScheduleState{}
	}
	h := schedules.GetHandle(ctx, workflows.RetentionScheduleID)
	desc, err := h.Describe(ctx)
	if err != nil {
		return nil, client.ScheduleState{}
	}
	if a, ok := desc.Schedule.Action.(*client.ScheduleWorkflowAction); !ok || a.TaskQueue != taskQueue || a.Workflow != workflows.RetentionWorkflowType {
		return nil, client.ScheduleState{}
	}
	var state client.ScheduleState
	if desc.Schedule.State != nil {
		state = *desc.Schedule.State
	}
	return h, state
}

// sameRetentionSchedule reports whether the existing schedule s already has spec, action
// (with input in) and the skip overlap policy.
func sameRetentionSchedule(s client.Schedule, spec client.ScheduleSpec, action *client.ScheduleWorkflowAction, in workflows.RetentionInput, dc converter.DataConverter) bool {
	if s.Spec == nil || len(s.Spec.Calendars) > 0 || len(s.Spec.CronExpressions) > 0 || !slices.Equal(s.Spec.Intervals, spec.Intervals) {
		return false
	}
	if s.Policy == nil || s.Policy.Overlap != enumspb.SCHEDULE_OVERLAP_POLICY_SKIP {
		return false
	}
	cur, ok := s.Action.(*client.ScheduleWorkflowAction)
	if !ok || cur.ID != action.ID || cur.TaskQueue != action.TaskQueue || cur.Workflow != action.Workflow || len(cur.Args) != 1 {
		return false
	}
	// Describe returns the arguments as payloads, as the client's data converter wrote them
	// (through its codec, if it has one). One that dc cannot decode (another data converter
	// or another codec key wrote it) counts as different, so it is rewritten.
	p, ok := cur.Args[0].(*commonpb.Payload)
	if !ok {
		return false
	}
	var got workflows.RetentionInput
	if err := dc.FromPayload(p, &got); err != nil {
		return false
	}
	return got == in
}
