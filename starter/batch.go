package starter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// heldBatch is the claimed rows of one topic of the batch lane that wait for their batch.
type heldBatch struct {
	topic  string
	policy workflows.BatchPolicy
	rows   []store.Claimed
	// leaseEnds are the rows' leases by this process's clock: their claims' start plus
	// the lease.
	leaseEnds []time.Time
	// due is when the batch must start: its wait after its first row was claimed, or
	// earlier when that row's lease would run out first.
	due time.Time
}

// lanes splits claimed rows into those that get a run of their own and those of the batch
// lane: rows of a topic whose policy has Batch, that no earlier delivery may have sent,
// while every worker on the task queue runs the batch lane (workflows.BatchVersion).
func (r *Relay) lanes(ctx context.Context, rows []store.Claimed) (own, batched []store.Claimed) {
	for _, row := range rows {
		if r.cfg.Policy(row.Topic).Batch == nil || row.MayHaveBeenSent() {
			own = append(own, row)
			continue
		}
		if r.version.Load() < workflows.BatchVersion {
			if r.batchesHeldBack.CompareAndSwap(false, true) {
				r.log.WarnContext(ctx, "A worker on the task queue runs an outbox without the batch lane: topics of lane batch are delivered one run per message until it is gone (upgrade workers before relays)",
					slog.String("topic", row.Topic), slog.Int("version", int(r.version.Load())), slog.Int("batch_version", workflows.BatchVersion))
			}
			own = append(own, row)
			continue
		}
		batched = append(batched, row)
	}
	return own, batched
}

// hold adds claimed rows of the batch lane, claimed at claimedAt, to their topics'
// waiting batches.
func (r *Relay) hold(rows []store.Claimed, claimedAt time.Time) {
	if len(rows) == 0 {
		return
	}
	leaseEnd := claimedAt.Add(r.cfg.Lease)
	// The batch starts after its wait, and in any case while its first row's lease leaves
	// time for the start.
	last := leaseEnd.Add(-min(r.cfg.StartTimeout, r.cfg.Lease/2))
	now := time.Now()
	r.batchMu.Lock()
	defer r.batchMu.Unlock()
	if r.held == nil {
		r.held = map[string]*heldBatch{}
	}
	for _, row := range rows {
		b := r.held[row.Topic]
		if b == nil {
			policy := r.cfg.Policy(row.Topic).Batch.WithDefaults()
			due := now.Add(policy.Wait)
			if last.Before(due) {
				due = last
			}
			b = &heldBatch{topic: row.Topic, policy: policy, due: due}
			r.held[row.Topic] = b
		}
		b.rows = append(b.rows, row)
		b.leaseEnds = append(b.leaseEnds, leaseEnd)
	}
}

// dueBatches takes the batches that are ready from the waiting ones: every full batch,
// and with all (or once its time has come) the rest of a topic's rows.
func (r *Relay) dueBatches(all bool) []*heldBatch {
	now := time.Now()
	r.batchMu.Lock()
	defer r.batchMu.Unlock()
	var out []*heldBatch
	topics := make([]string, 0, len(r.held))
	for t := range r.held {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	for _, t := range topics {
		b := r.held[t]
		for n := b.policy.Size; len(b.rows) >= n; {
			out = append(out, &heldBatch{topic: t, policy: b.policy, rows: b.rows[:n:n], leaseEnds: b.leaseEnds[:n:n], due: b.due})
			b.rows, b.leaseEnds = b.rows[n:], b.leaseEnds[n:]
		}
		if len(b.rows) > 0 && (all || !now.Before(b.due)) {
			out = append(out, b)
			b = &heldBatch{}
		}
		if len(b.rows) == 0 {
			delete(r.held, t)
		}
	}
	return out
}

// nextBatchDue is how long until the earliest waiting batch is due; ok is false when no
// batch waits.
func (r *Relay) nextBatchDue() (wait time.Duration, ok bool) {
	r.batchMu.Lock()
	defer r.batchMu.Unlock()
	var due time.Time
	for _, b := range r.held {
		if due.IsZero() || b.due.Before(due) {
			due = b.due
		}
	}
	if due.IsZero() {
		return 0, false
	}
	return max(time.Until(due), 0), true
}

// flushBatches starts the batches that are due, or every waiting one with all (when the
// relay stops: its rows would otherwise wait for their lease).
func (r *Relay) flushBatches(ctx context.Context, all bool) {
	for _, b := range r.dueBatches(all) {
		r.startBatchAsync(ctx, b)
	}
}

// startBatchAsync starts one OutboxBatch run for b (its workflow ID comes from its first
// message), at most StartConcurrency at once, and marks its rows dispatched once it
// started; it does not wait (Relay.batches does). Rows whose lease runs out before the
// start are left to the next claim. When the start meets a batch of that ID already (its
// rows were claimed again: a relay lost track of the start), the rows are handed to runs
// of their own, which check before they send.
func (r *Relay) startBatchAsync(ctx context.Context, b *heldBatch) {
	hand := context.WithoutCancel(ctx)
	r.batches.Add(1)
	go func() {
		defer r.batches.Done()
		r.startSem <- struct{}{}
		released := false
		release := func() {
			if !released {
				released = true
				<-r.startSem
			}
		}
		defer release()
		live := make([]store.Claimed, 0, len(b.rows))
		startBy := time.Now().Add(min(r.cfg.StartTimeout, r.cfg.Lease/2))
		for i, row := range b.rows {
			if startBy.Before(b.leaseEnds[i]) {
				live = append(live, row)
			}
		}
		if len(live) < len(b.rows) {
			r.log.InfoContext(ctx, "Lease running out before the batch's start; leaving its rows for the next claim",
				slog.String("topic", b.topic), slog.Int("rows", len(b.rows)-len(live)))
		}
		if len(live) == 0 {
			return
		}
		startCtx, cancel := context.WithTimeout(hand, r.cfg.StartTimeout)
		id, err := r.startBatch(startCtx, b.topic, live)
		cancel()
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		switch {
		case err == nil:
			for i := range live {
				live[i].Batch = id
			}
			release()
			r.markDispatched(hand, live)
			r.noteStarts(ctx, 1, 0, nil)
		case errors.As(err, &started):
			release() // the hand-over below takes slots of its own
			r.log.InfoContext(ctx, "A batch of this ID ran already: its rows were claimed again; each gets a run of its own, which checks before it sends",
				slog.String("workflow_id", id), slog.Int("rows", len(live)))
			p := r.newPass(hand, time.Now())
			p.handOver(live, func(store.Claimed) bool { return true })
			p.finish()
		default:
			r.noteStarts(ctx, 1, 1, &err)
			r.log.DebugContext(ctx, "Cannot start the batch; its rows are retried after the lease",
				slog.String("topic", b.topic), slog.Int("rows", len(live)), slog.Any("error", err))
		}
	}()
}

// startBatch starts the OutboxBatch run of rows, all of topic, and returns its workflow
// ID.
func (r *Relay) startBatch(ctx context.Context, topic string, rows []store.Claimed) (string, error) {
	policy := r.cfg.Policy(topic).WithDefaults()
	in := workflows.BatchInput{
		Topic:            topic,
		Messages:         make([]workflows.BatchMessage, len(rows)),
		Policy:           policy,
		SearchAttributes: !r.cfg.NoSearchAttributes,
		Version:          int(r.version.Load()),
		Deployment:       r.deploymentID(),
	}
	for i, row := range rows {
		in.Messages[i] = workflows.BatchMessage{MessageID: row.MessageID.String(), MaxRetryTimes: row.MaxRetryTimes}
	}
	id := workflows.BatchWorkflowID(rows[0].MessageID.String())
	opts := client.StartWorkflowOptions{
		ID:        id,
		TaskQueue: r.cfg.TaskQueue,
		// A batch runs once: a second start of the ID means its rows were claimed again.
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		StaticSummary:                            fmt.Sprintf("outbox batch %s: %d messages", topic, len(rows)),
		EnableEagerStart:                         r.cfg.EagerStart,
	}
	if in.SearchAttributes {
		opts.TypedSearchAttributes = workflows.BatchSearchAttributes(in)
	}
	if in.LocalSend() {
		// The send runs as a local activity inside the first workflow task, which must
		// outlast it.
		opts.WorkflowTaskTimeout = workflows.BatchTaskTimeout(in.Policy)
	}
	_, err := r.client.ExecuteWorkflow(ctx, opts, workflows.BatchWorkflowType, in)
	if err == nil {
		r.cfg.Metrics.BatchStarted(topic, len(rows))
	}
	return id, err
}
