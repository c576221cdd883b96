package starter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// heldBatch is the claimed rows of one topic of the batch lane that wait for their batch.
type heldBatch struct {
	topic string
	// policy is the topic's policy when its first row was held, which the batch's run is
	// started with: a policy published later (one without Batch, say) reaches the rows of
	// later claims, not the rows this batch already holds.
	policy workflows.Policy
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
// while every worker on the task queue runs the batch lane (workflows.BatchVersion). It
// reads each topic's policy once and returns those of the batched rows' topics, for hold.
func (r *Relay) lanes(ctx context.Context, rows []store.Claimed) (own, batched []store.Claimed, policies map[string]workflows.Policy) {
	policies = map[string]workflows.Policy{}
	for _, row := range rows {
		p, ok := policies[row.Topic]
		if !ok {
			p = r.cfg.Policy(row.Topic)
			policies[row.Topic] = p
		}
		if p.Batch == nil || row.MayHaveBeenSent() {
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
	return own, batched, policies
}

// hold adds claimed rows of the batch lane, claimed at claimedAt, to their topics'
// waiting batches; a topic without a waiting batch starts one under its policy in
// policies (each with Batch, as lanes returns them).
func (r *Relay) hold(rows []store.Claimed, policies map[string]workflows.Policy, claimedAt time.Time) {
	if len(rows) == 0 {
		return
	}
	leaseEnd := claimedAt.Add(r.cfg.Lease)
	// The batch starts after its wait, and in any case while its first row's lease leaves
	// time for the start, with a margin for the wait for a start slot.
	cut := min(r.cfg.StartTimeout, r.cfg.Lease/2)
	last := leaseEnd.Add(-cut - min(time.Second, r.cfg.Lease/10))
	now := time.Now()
	r.batchMu.Lock()
	defer r.batchMu.Unlock()
	if r.held == nil {
		r.held = map[string]*heldBatch{}
	}
	for _, row := range rows {
		b := r.held[row.Topic]
		if b == nil {
			policy := policies[row.Topic]
			due := now.Add(policy.Batch.WithDefaults().Wait)
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
		for n := b.policy.Batch.WithDefaults().Size; len(b.rows) >= n; {
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
	g := r.newStartGroup(ctx)
	for _, b := range r.dueBatches(all) {
		g.start(b)
	}
	g.close()
}

// startGroup is the batch starts of one pass: they run without holding up the next claim,
// and once the last has ended their outcome is noted as the pass's (noteStarts), as the
// starts of the message lane are.
type startGroup struct {
	r                  *Relay
	ctx                context.Context
	wg                 sync.WaitGroup
	attempted, refused atomic.Int32
	first              atomic.Pointer[error]
}

func (r *Relay) newStartGroup(ctx context.Context) *startGroup { return &startGroup{r: r, ctx: ctx} }

// close notes the group's starts once they have all ended.
func (g *startGroup) close() {
	g.r.batches.Go(func() {
		g.wg.Wait()
		g.r.noteStarts(g.ctx, int(g.attempted.Load()), int(g.refused.Load()), g.first.Load())
	})
}

// start starts one OutboxBatch run for b (its workflow ID comes from its first message)
// and marks its rows dispatched once it started, without waiting for it; it waits only
// while StartConcurrency batch starts are in flight, which keeps the claims from running
// ahead of the starts. Rows whose lease runs out before the start are left to the next
// claim. When the start meets a batch of that ID already (its rows were claimed again: a
// relay lost track of the start), the rows that batch took stay its own, and the others get
// runs of their own, which check before they send; so do all of them while an older worker
// keeps the batch lane off.
func (g *startGroup) start(b *heldBatch) {
	r := g.r
	hand := r.handContext(g.ctx)
	r.startSem <- struct{}{}
	g.wg.Add(1)
	r.batches.Go(func() {
		defer g.wg.Done()
		released := false
		release := func() {
			if !released {
				released = true
				<-r.startSem
			}
		}
		defer release()
		claimedAt := b.leaseEnds[0].Add(-r.cfg.Lease)
		live := make([]store.Claimed, 0, len(b.rows))
		startBy := time.Now().Add(min(r.cfg.StartTimeout, r.cfg.Lease/2))
		for i, row := range b.rows {
			if startBy.Before(b.leaseEnds[i]) {
				live = append(live, row)
			}
		}
		if len(live) < len(b.rows) {
			r.log.InfoContext(g.ctx, "Lease running out before the batch's start; leaving its rows for the next claim",
				slog.String("topic", b.topic), slog.Int("rows", len(b.rows)-len(live)))
		}
		if len(live) == 0 {
			return
		}
		// The version is read once: one refreshed between the check and the start must
		// not start a batch below BatchVersion.
		version := int(r.version.Load())
		if version < workflows.BatchVersion {
			release()
			r.handOverOwn(hand, claimedAt, live)
			return
		}
		startCtx, cancel := context.WithTimeout(hand, r.cfg.StartTimeout)
		id, err := r.startBatch(startCtx, b.topic, b.policy, live, version)
		cancel()
		release() // what follows takes slots of its own
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		switch {
		case err == nil:
			g.attempted.Add(1)
			for i := range live {
				live[i].Batch = id
			}
			r.markDispatched(context.WithoutCancel(hand), live)
		case errors.As(err, &started):
			// The earlier batch owns the rows it took, also after StopGrace.
			r.batchStartedBefore(context.WithoutCancel(hand), claimedAt, id, live)
		case hand.Err() != nil:
			r.log.InfoContext(g.ctx, "The relay stopped before the batch started; its rows are handed over after the lease",
				slog.String("topic", b.topic), slog.Int("rows", len(live)), slog.Any("error", err))
		default:
			g.attempted.Add(1)
			g.refused.Add(1)
			g.first.CompareAndSwap(nil, &err)
			r.log.DebugContext(g.ctx, "Cannot start the batch; its rows are retried after the lease",
				slog.String("topic", b.topic), slog.Int("rows", len(live)), slog.Any("error", err))
		}
	})
}

// batchStartedBefore handles a batch start that met a batch of the same ID: the rows of
// this claim that the earlier batch took (batch_id) are its own and are marked dispatched to
// it; the others get runs of their own, which check before they send.
func (r *Relay) batchStartedBefore(ctx context.Context, claimedAt time.Time, id string, rows []store.Claimed) {
	ids := make([]uuid.UUID, len(rows))
	for i, row := range rows {
		ids[i] = row.MessageID
	}
	readCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	current, err := r.store.GetAll(readCtx, ids)
	cancel()
	if err != nil {
		r.log.WarnContext(ctx, "A batch of this ID ran already, and its rows cannot be read; they are handed over after their lease",
			slog.String("workflow_id", id), slog.Int("rows", len(rows)), slog.Any("error", err))
		return
	}
	var taken, others []store.Claimed
	for _, row := range rows {
		if c, ok := current[row.MessageID]; ok && c.BatchID != nil && *c.BatchID == id {
			row.Batch = id
			taken = append(taken, row)
		} else {
			others = append(others, row)
		}
	}
	r.log.InfoContext(ctx, "A batch of this ID ran already: its rows were claimed again; the rows it took stay its own, the others get runs of their own",
		slog.String("workflow_id", id), slog.Int("its_rows", len(taken)), slog.Int("runs_of_their_own", len(others)))
	r.markDispatched(ctx, taken)
	r.handOverOwn(ctx, claimedAt, others)
}

// handOverOwn gives each of rows, claimed at claimedAt, a delivery run of its own that asks
// check-processed before it sends (a batch may have sent them).
func (r *Relay) handOverOwn(ctx context.Context, claimedAt time.Time, rows []store.Claimed) {
	if len(rows) == 0 {
		return
	}
	p := r.newPass(ctx, claimedAt)
	p.handOver(rows, func(store.Claimed) bool { return true })
	p.finish()
}

// startBatch starts the OutboxBatch run of rows, all of topic, under policy (which has
// Batch), at version, and returns its workflow ID.
func (r *Relay) startBatch(ctx context.Context, topic string, policy workflows.Policy, rows []store.Claimed, version int) (string, error) {
	in := workflows.BatchInput{
		Topic:            topic,
		Messages:         make([]workflows.BatchMessage, len(rows)),
		Policy:           policy.WithDefaults(),
		SearchAttributes: !r.cfg.NoSearchAttributes,
		Version:          version,
		Deployment:       r.deploymentID(),
	}
	for i, row := range rows {
		in.Messages[i] = workflows.BatchMessage{MessageID: row.MessageID.String(), MaxRetryTimes: row.MaxRetryTimes, ClaimToken: row.ClaimToken.String()}
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
