package workflows

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/nexus-rpc/sdk-go/nexus"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	dmsg "github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamworkflow"
)

// Search attribute keys.
var (
	topicKey     = temporal.NewSearchAttributeKeyKeyword(SearchAttrTopic)
	statusKey    = temporal.NewSearchAttributeKeyKeyword(SearchAttrStatus)
	messageIDKey = temporal.NewSearchAttributeKeyKeyword(SearchAttrMessageID)
)

// StartSearchAttributes returns the search attributes a delivery starts with: retrying
// for a message a batch handed over after a failed attempt.
func StartSearchAttributes(in DeliveryInput) temporal.SearchAttributes {
	status := SearchStatusDispatched
	if in.Prior != nil {
		status = SearchStatusRetrying
	}
	return temporal.NewSearchAttributes(
		topicKey.ValueSet(in.Topic),
		statusKey.ValueSet(string(status)),
		messageIDKey.ValueSet(in.MessageID),
	)
}

// BatchSearchAttributes returns the search attributes a batch starts with: its topic and
// SearchStatusBatch, so a search by topic finds the batches too.
func BatchSearchAttributes(in BatchInput) temporal.SearchAttributes {
	return temporal.NewSearchAttributes(
		topicKey.ValueSet(in.Topic),
		statusKey.ValueSet(string(SearchStatusBatch)),
	)
}

// Changes to OutboxDelivery that would not replay the histories recorded before them,
// for workflow.GetVersion. Runs recorded before a change keep its old path.
const (
	// changeMarkSentBounded (version 1): mark-sent retries until MarkSentTimeout, then the
	// run completes "delivered, not recorded". Before it, mark-sent retried forever.
	changeMarkSentBounded = "mark-sent-bounded"
	// changeUnknownOutcome (version 1): an unknown topic is retried through the attempts
	// (a rolling deploy may have a worker without the topic's handler), and a last attempt
	// that failed ambiguously is checked before the message is dead-lettered. Before it,
	// an unknown topic was dead-lettered at once and the last attempt was not checked.
	changeUnknownOutcome = "unknown-outcome-checked"
	// changePausedLastAttempt (version 1, asked of every run, whatever its input's
	// Version, on the one path it changes): a team's last attempt that failed while its
	// topic was paused no longer ends the run; the run waits for the resume and makes that
	// attempt again, as it makes its other attempts only after a resume. Before it, the
	// message was dead-lettered during the pause.
	changePausedLastAttempt = "paused-last-attempt-again"
	// changeBackoffCapped (version 1, asked of every run on the one path it changes): a
	// backoff whose product no Duration holds waits MaxInterval. Before it, the product
	// became a Duration first: on amd64 a negative one, so the run waited not at all and
	// its history has no timer there (on arm64 the largest, so it waited MaxInterval).
	changeBackoffCapped = "backoff-overflow-capped"
	// changeTeamWorkflowIDChecked (version 1, asked of every run on the one path it
	// changes): a workflow topic's rendered ID that no start can take
	// (teamworkflow.CheckWorkflowID: over Temporal's length limit, or the delivery run's
	// own ID) fails the attempt for good. Before it, the child start with an ID too long
	// failed the workflow task again and again (no history records it), and a start or
	// signal-with-start of the run's own ID found it running and counted the message
	// delivered.
	changeTeamWorkflowIDChecked = "team-workflow-id-checked"
	// changeUnansweredKept (version 1, asked of every run on the one path it changes): an
	// earlier attempt whose outcome is unknown, and whose check could not answer (it
	// failed, or found no worker), stays unknown through a later attempt that failed
	// cleanly: the next send, and the dead letter after the last attempt, are checked
	// first. Before it, the clean failure cleared it, and the next send or the dead
	// letter went ahead without a check.
	changeUnansweredKept = "unanswered-check-kept"
)

// dbRetryForever bounds the database steps that must succeed in the end (dead-letter, and
// mark-sent on runs recorded before changeMarkSentBounded): no practical bound. Without an
// explicit ScheduleToClose the SDK would use StartToClose as the bound and give up after a
// few tries, leaving the outcome unrecorded.
const dbRetryForever = 10 * 365 * 24 * time.Hour

// recordFailureOptions run record-failure: a few tries; the row's failure count is for
// operators, not for the delivery, which goes on either way.
var recordFailureOptions = workflow.LocalActivityOptions{
	StartToCloseTimeout:    10 * time.Second,
	ScheduleToCloseTimeout: 30 * time.Second,
}

// dbActivityOptions run the activities that only write to the outbox tables. They retry
// until they succeed: a delivered message must be recorded, a given-up one dead-lettered.
var dbActivityOptions = workflow.LocalActivityOptions{
	StartToCloseTimeout:    15 * time.Second,
	ScheduleToCloseTimeout: dbRetryForever,
	RetryPolicy: &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2,
		MaximumInterval:    time.Minute,
	},
}

// checkActivityOptions run check-processed: a read, tried a few times; when it cannot get
// an answer the workflow sends again (at-least-once).
var checkActivityOptions = workflow.ActivityOptions{
	StartToCloseTimeout: 30 * time.Second,
	RetryPolicy: &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2,
		MaximumAttempts:    3,
	},
}

// Waits while the outbox's own database is unavailable to the send activity: they grow
// from storeWaitInitial to storeWaitMax, and use up no attempt.
const (
	storeWaitInitial = time.Second
	storeWaitMax     = 30 * time.Second
)

// Waits while the message's topic is paused: they grow from pausedWaitInitial to
// pausedWaitMax and use up no attempt; each costs a timer and a send that finds the topic
// still paused. A run in its wait sends within pausedWaitMax of the resume.
const (
	pausedWaitInitial = 5 * time.Second
	pausedWaitMax     = time.Minute
)

// Delivery is the OutboxDelivery workflow: it sends the message until the topic's
// handler accepts it, then marks the row sent; when the attempts run out or the failure is
// permanent it dead-letters the message and fails with an ErrTypeDeadLettered error.
//
// Before a send whose predecessor's outcome is unknown (an ambiguous failure, or a
// previous run of the message, DeliveryInput.CheckFirst) it asks check-processed, and
// records the message sent without sending when the downstream has it. A send that could
// not load the message because the outbox's database was unavailable uses up no attempt.
//
// A run whose input asks for a version newer than DeliveryVersion panics before it does
// anything: its workflow task fails and is retried, for a worker that runs that version.
func Delivery(ctx workflow.Context, in DeliveryInput) (DeliveryResult, error) {
	if in.Version > DeliveryVersion {
		panic(fmt.Sprintf("message %s: OutboxDelivery version %d was asked for, and this worker runs versions up to %d: "+
			"left for a worker that runs it (upgrade the workers before the relays)", in.MessageID, in.Version, DeliveryVersion))
	}
	d := newDelivery(ctx, in)
	var (
		last     failure
		unknown  = in.CheckFirst // a send may have happened before this run
		attempt  = 1
		storeOut int // consecutive sends that found the database unavailable or reached another deployment
		pausedN  int // consecutive sends that found the topic paused
		local    = d.localFirst()
	)
	if local && firstTaskRetried(ctx) {
		// An earlier try of this first workflow task did not complete (its worker was lost
		// mid-send, or it failed): its local send may have reached the downstream. Ask
		// first, as after any ambiguous failure, and send as a regular activity.
		d.logger.Warn("The first workflow task was tried before; its local send may have happened: checking before sending")
		local, unknown = false, true
	}
	if p := in.Prior; p != nil && in.Version >= BatchVersion {
		// A batch made the first attempt and handed the message over: go on from it.
		last = priorFailure(p)
		unknown, attempt, local = last.ambiguous, max(p.Attempts, 1), false
		d.logger.Info("Handed over by a batch after a failed attempt; going on from it",
			"batch", p.Batch, "attempt", attempt, "max_attempts", d.maxAttempts, "error", last.message)
		if last.permanent || attempt >= d.maxAttempts {
			return d.giveUp(attempt, last)
		}
		if err := d.backoff(attempt, last); err != nil {
			return DeliveryResult{}, err
		}
		attempt++
	}
	for {
		if unknown {
			if d.checkProcessed() {
				return d.markSent(attempt-1, true)
			}
		}
		var (
			recorded bool
			err      error
		)
		if local {
			// Only the first try of the first attempt is local: a retry of it (the
			// database was unavailable) and every later attempt are regular activities.
			local = false
			recorded, err = d.sendLocal(attempt)
		} else {
			recorded, err = d.send(attempt)
		}
		if pausedN > 0 && !isTopicPaused(err) {
			// The send ran: the pause is over. A delivered run takes back the status it
			// had (a failed send sets retrying or dead itself).
			d.logger.Info("The topic is no longer paused", "attempt", attempt, "waits", pausedN)
			pausedN = 0
			switch {
			case err != nil:
			case last.message != "":
				d.setStatus(SearchStatusRetrying)
			default:
				d.setStatus(SearchStatusDispatched)
			}
		}
		if err == nil {
			if recorded && d.in.Version >= 4 {
				// The send recorded the row sent: no mark-sent step.
				return DeliveryResult{Attempts: attempt, Started: d.started}, nil
			}
			return d.markSent(attempt, false)
		}
		f := d.classify(err)
		if f.topicPaused {
			// Nothing was sent: wait for the resume and try the same attempt again.
			pausedN++
			if pausedN == 1 {
				d.logger.Info("The topic is paused; waiting for the resume without using up the attempt", "attempt", attempt)
				d.setStatus(SearchStatusPaused)
			}
			if err := workflow.Sleep(ctx, min(pausedWaitInitial<<min(pausedN-1, 10), pausedWaitMax)); err != nil {
				return DeliveryResult{}, err
			}
			continue
		}
		if f.storeUnavailable || f.wrongDeployment || f.topicBusy {
			// Nothing was sent: wait for the database, for a worker of this message's
			// own deployment, or for a send slot of the topic, and try the same attempt
			// again.
			storeOut++
			wait := min(storeWaitInitial<<min(storeOut-1, 10), storeWaitMax)
			switch {
			case f.topicBusy:
				// A slot frees when one of the topic's sends ends, at worst at its timeout:
				// asking more often than the paused waits only adds tasks.
				wait = min(pausedWaitInitial<<min(storeOut-1, 10), pausedWaitMax)
				d.logger.Info("The topic's sends fill their slots on the worker; the attempt is not used up", "attempt", attempt, "wait", wait, "error", f.message)
			case f.wrongDeployment:
				d.logger.Warn("The send reached a worker of another outbox database on this task queue; the attempt is not used up", "attempt", attempt, "wait", wait, "error", f.message)
			default:
				d.logger.Warn("The outbox database is unavailable; the attempt is not used up", "attempt", attempt, "wait", wait, "error", f.message)
			}
			if err := workflow.Sleep(ctx, wait); err != nil {
				return DeliveryResult{}, err
			}
			continue
		}
		storeOut = 0
		last, unknown = f, f.ambiguous
		if !f.ambiguous && d.unanswered && d.patched(changeUnansweredKept) {
			// A check before this attempt could not tell whether an earlier one reached
			// the downstream; this attempt's clean failure does not tell either.
			unknown = true
		}
		paused := d.recordFailure(attempt, f)
		if paused && !f.permanent && attempt == d.maxAttempts && d.patched(changePausedLastAttempt) {
			// The team's last attempt failed while its topic was paused: it does not end
			// the run. Wait for the resume, back off, and make the last attempt again
			// (after checking first when it failed ambiguously).
			if err := d.waitWhilePaused(attempt); err != nil {
				return DeliveryResult{}, err
			}
			if err := d.backoff(attempt, f); err != nil {
				return DeliveryResult{}, err
			}
			continue
		}
		if f.permanent || attempt == d.maxAttempts {
			break
		}
		if paused {
			if err := d.waitWhilePaused(attempt); err != nil {
				return DeliveryResult{}, err
			}
		}
		if err := d.backoff(attempt, f); err != nil {
			return DeliveryResult{}, err
		}
		attempt++
	}
	return d.giveUp(attempt, last)
}

// giveUp ends a run whose attempts are used up or whose last failure was permanent: a last
// ambiguous attempt, or an earlier one whose check could not answer, is checked first (the
// downstream may have the message), then the message is dead-lettered.
func (d *delivery) giveUp(attempt int, last failure) (DeliveryResult, error) {
	unknown := last.ambiguous || d.unanswered && d.patched(changeUnansweredKept)
	if unknown && d.checkable && d.changed(changeUnknownOutcome) {
		if d.checkProcessed() {
			return d.markSent(attempt, true)
		}
	}
	return d.deadLetter(attempt, last)
}

// priorFailure reads a batch's failed attempt as classify reads a send's error.
func priorFailure(p *PriorAttempt) failure {
	f := failure{message: p.Error, retryAfter: p.RetryAfter}
	switch p.ErrType {
	case ErrTypePermanent:
		f.permanent = true
	case ErrTypeRetryable, ErrTypeUnknownTopic:
		// Nothing was sent (an unknown topic is retried: another worker may know it).
	default:
		f.ambiguous = true
	}
	return f
}

// delivery is one run of Delivery: its input, resolved policy and activity contexts.
type delivery struct {
	ctx         workflow.Context
	in          DeliveryInput
	policy      Policy
	maxAttempts int
	logger      log.Logger
	dbCtx       workflow.Context
	sendCtx     workflow.Context
	localCtx    workflow.Context // the first attempt as a local activity
	checkCtx    workflow.Context
	signalCtx   workflow.Context // the signal activity, on the outbox's task queue
	// checkable is false once check-processed said the topic's handler cannot tell.
	checkable bool
	// unanswered is true while the last check failed to answer: an earlier send may have
	// reached the downstream, and nothing has told since.
	unanswered bool
	versions   map[string]bool
	// loaded is the message, for a topic delivered by a team's activity or workflow, once
	// read.
	loaded *LoadMessageResult
	// started is the team's workflow this run started or found started.
	started *StartedWorkflow
}

func newDelivery(ctx workflow.Context, in DeliveryInput) *delivery {
	policy := in.Policy.WithDefaults()
	d := &delivery{
		ctx:         ctx,
		in:          in,
		policy:      policy,
		maxAttempts: max(policy.MaxAttempts, 1), // never 0: that would mean "unlimited"
		logger:      workflow.GetLogger(ctx),
		dbCtx:       workflow.WithLocalActivityOptions(ctx, dbActivityOptions),
		sendCtx: workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: policy.SendTimeout,
			RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
		}),
		localCtx: workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			// ScheduleToClose as well: the send must end within the first workflow task's
			// budget (localSendFits), waiting for a local activity slot included.
			StartToCloseTimeout:    policy.SendTimeout,
			ScheduleToCloseTimeout: policy.SendTimeout,
			RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		}),
		checkCtx:  workflow.WithActivityOptions(ctx, checkActivityOptions),
		checkable: true,
		versions:  map[string]bool{},
	}
	if in.Version >= 4 && in.Message != nil && !in.CheckFirst {
		// The relay read the message of a team's topic with the claim: no load step. The
		// message carries its ordering key, as a loaded one does (earlier relays put the
		// key in the input only).
		msg := *in.Message
		msg.OrderingKey = cmp.Or(msg.OrderingKey, in.OrderingKey)
		d.loaded = &LoadMessageResult{Message: msg, OrderingKey: in.OrderingKey}
	}
	if a := policy.Activity; a != nil {
		// The team's activities run on the team's task queue; each attempt is one
		// execution, as with the send activity.
		d.sendCtx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			TaskQueue:              a.TaskQueue,
			StartToCloseTimeout:    a.StartToClose,
			ScheduleToStartTimeout: a.ScheduleToStart,
			RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		check := checkActivityOptions
		check.TaskQueue, check.ScheduleToStartTimeout = a.TaskQueue, a.ScheduleToStart
		d.checkCtx = workflow.WithActivityOptions(ctx, check)
		d.checkable = a.CheckActivity != ""
	}
	if n := policy.Nexus; n != nil {
		d.checkable = n.CheckOperation != ""
	}
	if policy.Workflow != nil {
		// Nothing to ask: the started workflow's ID is the de-duplication key.
		d.checkable = false
		d.signalCtx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: policy.SendTimeout,
			RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
		})
	}
	return d
}

// changed reports whether this run takes the new path of change. A run whose input names
// DeliveryVersion 2 or later takes every change below; another asks workflow.GetVersion
// once per change, the first time the change matters.
func (d *delivery) changed(change string) bool {
	if d.in.Version >= 2 {
		return true
	}
	return d.patched(change)
}

// patched reports whether this run takes the new path of a change made after the last
// DeliveryVersion, asking workflow.GetVersion once, the first time the change matters: a
// run recorded before the change replays its old path, and a new run records the marker.
// For changes on paths rare enough that the marker in the runs that take them (two
// history events, and no action by Temporal Cloud's rules: the TemporalChangeVersion
// update that comes with it is free) is preferable to a new DeliveryVersion.
func (d *delivery) patched(change string) bool {
	v, ok := d.versions[change]
	if !ok {
		v = workflow.GetVersion(d.ctx, change, workflow.DefaultVersion, 1) >= 1
		d.versions[change] = v
	}
	return v
}

// setStatus keeps the OutboxStatus search attribute up to date, when it is on.
func (d *delivery) setStatus(status SearchStatus) {
	if !d.in.SearchAttributes {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(d.ctx, statusKey.ValueSet(string(status))); err != nil {
		d.logger.Warn("Cannot update search attribute", SearchAttrStatus, status, "error", err)
	}
}

// send runs one send attempt: the send activity, or the team's activity, workflow or
// Nexus operation of the topic. recorded reports a send activity that recorded the row
// sent itself.
func (d *delivery) send(attempt int) (recorded bool, err error) {
	if w := d.policy.Workflow; w != nil {
		return false, d.startWorkflow(w, attempt)
	}
	if n := d.policy.Nexus; n != nil {
		msg, _, done, err := d.attemptMessage(attempt)
		if err != nil || done {
			return false, err
		}
		return false, d.nexusOperation(n, n.Operation, msg).Get(d.ctx, nil)
	}
	a := d.policy.Activity
	if a == nil {
		var res SendResult
		err := workflow.ExecuteActivity(d.sendCtx, ActivitySend, d.sendInput(attempt)).Get(d.ctx, &res)
		return res.Recorded, err
	}
	msg, _, done, err := d.attemptMessage(attempt)
	if err != nil || done {
		return false, err
	}
	return false, workflow.ExecuteActivity(d.sendCtx, a.Activity, msg).Get(d.ctx, nil)
}

// sendLocal runs the first attempt as a local activity, in the workflow task that runs
// it: delivered and recorded, the run completes in that task.
func (d *delivery) sendLocal(attempt int) (recorded bool, err error) {
	var res SendResult
	err = workflow.ExecuteLocalActivity(d.localCtx, ActivitySend, d.sendInput(attempt)).Get(d.ctx, &res)
	return res.Recorded, err
}

func (d *delivery) sendInput(attempt int) SendInput {
	return SendInput{MessageID: d.in.MessageID, Topic: d.in.Topic, Attempt: attempt, MaxAttempts: d.maxAttempts, Deployment: d.in.Deployment}
}

// localFirst reports whether the first attempt runs as a local activity: the input asks
// for it (DeliveryInput.LocalFirstAttempt), and the run's workflow task timeout leaves
// the send room to end before the SDK would heartbeat the task (a run started without
// FirstTaskTimeout, by a client of its own, sends as a regular activity instead).
func (d *delivery) localFirst() bool {
	if !d.in.LocalFirstAttempt() {
		return false
	}
	return localSendFits(workflow.GetInfo(d.ctx).WorkflowTaskTimeout, d.policy.SendTimeout)
}

// firstTaskStartedEventID is the event ID of a run's first WorkflowTaskStarted when its
// first workflow task is tried once: WorkflowExecutionStarted, WorkflowTaskScheduled,
// WorkflowTaskStarted.
const firstTaskStartedEventID = 3

// firstTaskRetried reports, in the run's first workflow task, whether an earlier try of
// that task failed or timed out (its events come before this try's start). It reads the
// history, so replay gives the same answer.
func firstTaskRetried(ctx workflow.Context) bool {
	return workflow.GetInfo(ctx).GetCurrentHistoryLength() > firstTaskStartedEventID
}

// attemptMessage is the message a team's activity or workflow gets for attempt n, and its
// ordering key. done reports a row an earlier run recorded sent: delivering it again
// would duplicate it.
func (d *delivery) attemptMessage(attempt int) (msg dmsg.Message, orderingKey string, done bool, err error) {
	loaded, err := d.load()
	if err != nil || loaded.AlreadySent {
		return msg, "", err == nil, err
	}
	msg = loaded.Message
	msg.Attempt, msg.MaxAttempts = attempt, d.maxAttempts
	return msg, loaded.OrderingKey, false, nil
}

// startWorkflow starts the team's workflow as a child that outlives the delivery. A
// workflow already started with the ID (by an earlier delivery of the message, or by
// another message whose template gives the same ID) counts as delivered.
func (d *delivery) startWorkflow(w *WorkflowHandler, attempt int) error {
	msg, orderingKey, done, err := d.attemptMessage(attempt)
	if err != nil || done {
		return err
	}
	// Decoding the recorded payload is deterministic (workflowcheck sees reflection and
	// allocation in encoding/json, and flags them).
	id, err := teamworkflow.RenderWorkflowID(w.WorkflowID, msg, orderingKey) //workflowcheck:ignore
	if err != nil {
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypePermanent, nil)
	}
	if err := teamworkflow.CheckWorkflowID(w.WorkflowID, id, workflow.GetInfo(d.ctx).WorkflowExecution.ID); err != nil && d.patched(changeTeamWorkflowIDChecked) {
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypePermanent, nil)
	}
	if w.Signal != "" {
		var started StartedWorkflow
		err := workflow.ExecuteActivity(d.signalCtx, ActivitySignalWithStart, SignalWithStartInput{
			WorkflowID: id, Workflow: w.Workflow, TaskQueue: w.TaskQueue, Signal: w.Signal, IDReuse: w.IDReuse, Message: msg,
			MayHaveBeenSent: d.in.CheckFirst,
		}).Get(d.ctx, &started)
		if err != nil {
			return err
		}
		d.started = &started
		return nil
	}
	ctx := workflow.WithChildOptions(d.ctx, workflow.ChildWorkflowOptions{
		WorkflowID:            id,
		TaskQueue:             w.TaskQueue,
		ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
		WorkflowIDReusePolicy: IDReusePolicies[w.IDReuse],
	})
	var exec workflow.Execution
	err = workflow.ExecuteChildWorkflow(ctx, w.Workflow, msg).GetChildWorkflowExecution().Get(d.ctx, &exec)
	if temporal.IsWorkflowExecutionAlreadyStartedError(err) {
		d.logger.Info("Workflow already started; counted as delivered", "workflow_id", id)
		d.started = &StartedWorkflow{WorkflowID: id}
		return nil
	}
	if err != nil {
		return err
	}
	d.started = &StartedWorkflow{WorkflowID: exec.ID, RunID: exec.RunID}
	return nil
}

// nexusOperation calls operation of the topic's Nexus service with msg: one operation in
// the history, bounded by the topic's Nexus timeout.
func (d *delivery) nexusOperation(n *NexusHandler, operation string, msg dmsg.Message) workflow.NexusOperationFuture {
	c := workflow.NewNexusClient(n.Endpoint, n.Service)
	return c.ExecuteOperation(d.ctx, operation, msg, workflow.NexusOperationOptions{ScheduleToCloseTimeout: n.Timeout})
}

// load reads the message for a team's activity, once per run (a local activity: the
// payload is in the history, encoded by the payload codec when one is configured).
func (d *delivery) load() (*LoadMessageResult, error) {
	if d.loaded != nil {
		return d.loaded, nil
	}
	var res LoadMessageResult
	if err := workflow.ExecuteLocalActivity(d.dbCtx, ActivityLoadMessage, LoadMessageInput{MessageID: d.in.MessageID}).Get(d.ctx, &res); err != nil {
		return nil, err
	}
	d.loaded = &res
	return d.loaded, nil
}

// checkProcessed asks whether the downstream already has the message. It answers false
// when it cannot tell: then the message is sent (again), at least once.
func (d *delivery) checkProcessed() bool {
	if !d.checkable {
		return false
	}
	if d.policy.Activity != nil || d.policy.Nexus != nil {
		return d.checkWithTeam()
	}
	var res CheckProcessedResult
	in := CheckProcessedInput{MessageID: d.in.MessageID, Topic: d.in.Topic, Deployment: d.in.Deployment}
	err := workflow.ExecuteActivity(d.checkCtx, ActivityCheckProcessed, in).Get(d.ctx, &res)
	for n := 1; isWrongDeployment(err); n++ {
		// Only workers of another outbox database answered: nothing was asked. Ask again
		// after a wait rather than send without an answer.
		wait := min(storeWaitInitial<<min(n-1, 10), storeWaitMax)
		d.logger.Warn("Check-processed reached a worker of another outbox database on this task queue; asking again", "wait", wait, "error", err)
		if serr := workflow.Sleep(d.ctx, wait); serr != nil {
			return false
		}
		err = workflow.ExecuteActivity(d.checkCtx, ActivityCheckProcessed, in).Get(d.ctx, &res)
	}
	d.unanswered = err != nil
	switch {
	case err != nil:
		d.logger.Warn("Check-processed failed; sending again", "error", err)
	case !res.Supported:
		d.checkable = false
	}
	return err == nil && res.Supported && res.Processed
}

// recordFailure records a failed attempt of a team's activity, workflow start or Nexus
// operation on the row, as the send activity records its own. A failure to record is
// logged and ignored.
//
// For a team's topic it reports whether the record found the topic paused: the team's
// attempts do not read the pause, so the run learns of it here.
func (d *delivery) recordFailure(attempt int, f failure) (paused bool) {
	if !d.policy.DeliveredByTeam() {
		return false // the send activity recorded it
	}
	errType := ErrTypeRetryable
	switch {
	case f.permanent:
		errType = ErrTypePermanent
	case f.ambiguous:
		errType = ErrTypeAmbiguous
	}
	ctx := workflow.WithLocalActivityOptions(d.ctx, recordFailureOptions)
	err := workflow.ExecuteLocalActivity(ctx, ActivityRecordFailure, RecordFailureInput{
		MessageID: d.in.MessageID, Topic: d.in.Topic, Attempt: attempt, Error: f.message, ErrType: errType,
	}).Get(d.ctx, nil)
	if isTopicPaused(err) {
		return true // recorded, and the topic is paused
	}
	if err != nil {
		d.logger.Warn("Cannot record the failed attempt on the row", "attempt", attempt, "error", err)
	}
	return false
}

// waitWhilePaused holds a run of a team's topic, after a failed attempt found the topic
// paused, until the pause ends: waits as for a paused send (pausedWaitInitial to
// pausedWaitMax), each followed by a read of the row (the load-message local activity),
// so no attempt of the team's is used up meanwhile. The run is marked paused until the
// backoff after it marks it retrying.
func (d *delivery) waitWhilePaused(attempt int) error {
	d.logger.Info("The topic is paused; waiting for the resume before the next attempt", "attempt", attempt)
	d.setStatus(SearchStatusPaused)
	for n := 1; ; n++ {
		if err := workflow.Sleep(d.ctx, min(pausedWaitInitial<<min(n-1, 10), pausedWaitMax)); err != nil {
			return err
		}
		var res LoadMessageResult
		err := workflow.ExecuteLocalActivity(d.dbCtx, ActivityLoadMessage, LoadMessageInput{MessageID: d.in.MessageID}).Get(d.ctx, &res)
		if err != nil || !res.Paused {
			// Resumed, or the row cannot be read (the next attempt says why). The
			// backoff that follows marks the run retrying again.
			d.logger.Info("The topic is no longer paused", "attempt", attempt, "waits", n)
			return nil
		}
	}
}

// checkWithTeam asks the topic's check on the team's side: its check activity on the
// team's task queue, or its check operation through the Nexus endpoint.
func (d *delivery) checkWithTeam() bool {
	loaded, err := d.load()
	if err != nil {
		d.logger.Warn("Cannot load the message to check it; sending again", "error", err)
		d.unanswered = true
		return false
	}
	if loaded.AlreadySent {
		return true
	}
	var (
		check workflow.Future
		what  string
	)
	if n := d.policy.Nexus; n != nil {
		check, what = d.nexusOperation(n, n.CheckOperation, loaded.Message), "operation "+n.CheckOperation
	} else {
		a := d.policy.Activity
		check, what = workflow.ExecuteActivity(d.checkCtx, a.CheckActivity, loaded.Message), "activity "+a.CheckActivity
	}
	var processed bool
	err = check.Get(d.ctx, &processed)
	d.unanswered = err != nil
	if err != nil {
		d.logger.Warn("The check failed; sending again", "check", what, "error", err)
		return false
	}
	return processed
}

// backoff waits after failed attempt n: the policy's backoff, or the downstream's
// Retry-After capped by MaxInterval.
func (d *delivery) backoff(n int, f failure) error {
	wait := d.policy.Backoff(n)
	if d.policy.BackoffOverflows(n) && !d.patched(changeBackoffCapped) {
		wait = d.policy.BackoffBeforeCap(n)
	}
	if f.retryAfter > 0 {
		wait = min(f.retryAfter, d.policy.MaxInterval)
	}
	d.logger.Info("Send attempt failed; retrying", "attempt", n, "max_attempts", d.maxAttempts, "wait", wait, "error", f.message)
	d.setStatus(SearchStatusRetrying)
	return workflow.Sleep(d.ctx, wait)
}

// markSent records the delivered message. Version 1 of changeMarkSentBounded bounds it: a
// database that stays unreachable past MarkSentTimeout no longer keeps a delivered
// message's run open. The run then completes "delivered, not recorded", and the relay's
// reconciliation records the row from the completed run. Runs recorded before version 1
// retry until they succeed.
func (d *delivery) markSent(attempts int, alreadyProcessed bool) (DeliveryResult, error) {
	markCtx := d.dbCtx
	bounded := d.changed(changeMarkSentBounded)
	if bounded {
		opts := dbActivityOptions
		opts.ScheduleToCloseTimeout = d.policy.MarkSentTimeout
		markCtx = workflow.WithLocalActivityOptions(d.ctx, opts)
	}
	in := MarkSentInput{MessageID: d.in.MessageID, Attempts: attempts, TeamAttempt: d.policy.DeliveredByTeam() && !alreadyProcessed}
	err := workflow.ExecuteLocalActivity(markCtx, ActivityMarkSent, in).Get(d.ctx, nil)
	if err != nil && !bounded {
		return DeliveryResult{}, fmt.Errorf("mark message sent: %w", err)
	}
	if d.in.Version < 3 {
		// From version 3 the run's Completed status says sent: no upsert (one action).
		d.setStatus(SearchStatusSent)
	}
	if err != nil {
		d.logger.Warn("Delivered, but the row could not be recorded sent; reconciliation will record it", "error", err)
		return DeliveryResult{Attempts: attempts, AlreadyProcessed: alreadyProcessed, Unrecorded: true}, nil
	}
	return DeliveryResult{Attempts: attempts, AlreadyProcessed: alreadyProcessed, Started: d.started}, nil
}

// deadLetter moves the message to the dead letters (retrying until that succeeds) and
// returns the non-retryable error the run fails with.
func (d *delivery) deadLetter(attempts int, last failure) (DeliveryResult, error) {
	reason := fmt.Sprintf("gave up after %d attempts: %s", attempts, last.message)
	if last.permanent {
		reason = "permanent failure: " + last.message
	}
	info := workflow.GetInfo(d.ctx)
	var res DeadLetterResult
	err := workflow.ExecuteLocalActivity(d.dbCtx, ActivityDeadLetter, DeadLetterInput{
		MessageID:  d.in.MessageID,
		Topic:      d.in.Topic,
		WorkflowID: info.WorkflowExecution.ID,
		RunID:      info.WorkflowExecution.RunID,
		Attempts:   attempts,
		LastError:  reason,
	}).Get(d.ctx, &res)
	if err != nil {
		return DeliveryResult{}, fmt.Errorf("dead-letter message: %w", err)
	}
	if res.AlreadySent {
		// An attempt whose answer was lost (it timed out after the send recorded the row)
		// delivered the message: the run ends delivered, as the row says, not failed red
		// with a dead letter that does not exist. No version marker guards it: a step of
		// an earlier release returned no result, so its histories replay the old path,
		// and the run ends in the workflow task that records the result.
		d.logger.Info("The message is recorded sent: an attempt whose answer was lost delivered it; no dead letter", "attempts", attempts, "error", reason)
		return DeliveryResult{Attempts: attempts, AlreadyProcessed: true, Started: d.started}, nil
	}
	d.setStatus(SearchStatusDead)
	return DeliveryResult{}, temporal.NewNonRetryableApplicationError(
		"message dead-lettered: "+reason, ErrTypeDeadLettered, nil, attempts)
}

type failure struct {
	message          string
	permanent        bool
	ambiguous        bool
	storeUnavailable bool
	wrongDeployment  bool // a worker of another outbox database refused the send
	topicPaused      bool // the send found the topic paused
	topicBusy        bool // the worker had no send slot left for the topic
	retryAfter       time.Duration
}

// nexusFailure returns what a Nexus operation's error says about the attempt: the error
// the handler failed the operation with (the SDK wraps it in an ApplicationError of type
// "OperationError", non-retryable because the operation ended), the handler's refusal, or
// the timeout; err itself when it is not an operation's error.
func nexusFailure(err error) error {
	var opErr *temporal.NexusOperationError
	if !errors.As(err, &opErr) || opErr.Cause == nil {
		return err
	}
	var appErr *temporal.ApplicationError
	if errors.As(opErr.Cause, &appErr) && appErr.Type() == nexusOperationErrorType && appErr.Unwrap() != nil {
		return appErr.Unwrap()
	}
	return opErr.Cause
}

// nexusOperationErrorType is the type of the ApplicationError a failed Nexus operation's
// error arrives in.
const nexusOperationErrorType = "OperationError"

// isTopicPaused reports whether err is the send activity's ErrTypeTopicPaused.
func isTopicPaused(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == ErrTypeTopicPaused
}

// isWrongDeployment reports whether err is an activity's ErrTypeWrongDeployment.
func isWrongDeployment(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == ErrTypeWrongDeployment
}

// classify reads a send activity's error. A timeout, a crash of the worker or any error
// the handler did not classify is ambiguous: the downstream may have the message.
func (d *delivery) classify(err error) failure {
	var (
		appErr     *temporal.ApplicationError
		timeoutErr *temporal.TimeoutError
		panicErr   *temporal.PanicError
		handlerErr *nexus.HandlerError
		team       = d.policy.DeliveredByTeam()
	)
	if n := d.policy.Nexus; n != nil {
		err = nexusFailure(err)
		if errors.As(err, &timeoutErr) {
			return failure{message: fmt.Sprintf("Nexus operation %s did not complete within %s (the handler is down, unreachable or slower)", n, n.Timeout), ambiguous: true}
		}
		if errors.As(err, &handlerErr) && !errors.As(err, &appErr) {
			// The handler refused the request itself (its worker has no such service or
			// operation, or cannot read the input): no retry makes it take the message.
			msg := fmt.Sprintf("Nexus operation %s: %s", n, handlerErr.Error())
			return failure{message: msg, permanent: !handlerErr.Retryable(), ambiguous: handlerErr.Retryable()}
		}
	}
	switch {
	case errors.As(err, &appErr):
		f := failure{message: appErr.Message(), retryAfter: appErr.NextRetryDelay()}
		switch {
		case appErr.Type() == ErrTypeStoreUnavailable:
			f.storeUnavailable = true
		case appErr.Type() == ErrTypeTopicPaused && !team:
			// Only the outbox's own send activity says this.
			f.topicPaused = true
		case appErr.Type() == ErrTypeTopicBusy && !team:
			f.topicBusy = true
		case appErr.Type() == ErrTypeWrongDeployment && !team:
			// Only the outbox's own send activity says this; a team's activity that did
			// would be read as the team's failure below.
			f.wrongDeployment = true
		case appErr.Type() == ErrTypeUnknownTopic && d.changed(changeUnknownOutcome):
			// Nothing was sent; another worker (or this one after a deploy) may know it.
		case appErr.NonRetryable() || appErr.Type() == ErrTypePermanent || appErr.Type() == ErrTypeUnknownTopic:
			f.permanent = true
		case appErr.Type() == ErrTypeRetryable:
		case team && appErr.Type() != ErrTypeAmbiguous:
			// A team's activity or operation failed as Temporal's retries see it: it did
			// not do its work, and another attempt may.
		default:
			f.ambiguous = true
		}
		return f
	case errors.As(err, &timeoutErr):
		if a := d.policy.Activity; a != nil && timeoutErr.TimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START {
			// No worker picked the attempt up: nothing ran.
			return failure{message: fmt.Sprintf("no worker of task queue %s started activity %s within %s", a.TaskQueue, a.Activity, a.ScheduleToStart)}
		}
		return failure{message: fmt.Sprintf("send timed out (%s)", timeoutErr.TimeoutType()), ambiguous: true}
	case errors.As(err, &panicErr):
		return failure{message: "send panicked: " + panicErr.Error(), ambiguous: true}
	default:
		msg := err.Error()
		if cause := errors.Unwrap(err); cause != nil {
			msg = cause.Error()
		}
		// A workflow start that failed started nothing.
		return failure{message: msg, ambiguous: d.policy.Workflow == nil}
	}
}
