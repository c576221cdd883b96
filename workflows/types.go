// Package workflows holds OutboxDelivery, the workflow that delivers one outbox message,
// and the inputs and results it exchanges with the relay and the activities.
//
// The workflow drives the attempts itself: each send is one activity execution with
// MaximumAttempts 1, and between attempts the workflow sleeps for the backoff (or the
// downstream's Retry-After). So every attempt and its failure stays in the history the
// Temporal UI shows, and after an ambiguous failure it can ask the downstream whether the
// message was processed before it sends again. The first attempt of a sink topic runs as
// a local activity inside the first workflow task (Policy.LocalFirstAttempt), so a message
// the downstream accepts at once costs the start and that task; every later attempt is a
// regular activity.
package workflows

import (
	"cmp"
	"fmt"
	"math"
	"time"

	dmsg "github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamactivity"
	"github.com/outbox-go/outbox/sinks/teamnexus"
	"github.com/outbox-go/outbox/sinks/teamworkflow"
)

// Names other tools and documents rely on.
const (
	// WorkflowType is the registered name of the delivery workflow.
	WorkflowType = "OutboxDelivery"
	// DefaultTaskQueue is the task queue of the workflow and its activities.
	DefaultTaskQueue = "outbox"
	// WorkflowIDPrefix starts every delivery workflow ID: outbox-<message_id>.
	WorkflowIDPrefix = "outbox-"

	// Activity names.
	ActivitySend           = "OutboxSend"
	ActivityCheckProcessed = "OutboxCheckProcessed"
	ActivityMarkSent       = "OutboxMarkSent"
	ActivityDeadLetter     = "OutboxDeadLetter"
	// ActivityLoadMessage reads a message for a topic delivered by a team's activity
	// (see ActivityHandler).
	ActivityLoadMessage = "OutboxLoadMessage"

	// ErrTypeDeadLettered is the type of the error a run fails with after its message was
	// dead-lettered.
	ErrTypeDeadLettered = "OutboxDeadLettered"
	// ErrTypePermanent marks a send failure that no retry can fix (a 4xx, an unknown
	// topic, a payload the handler rejects).
	ErrTypePermanent = dmsg.ErrTypePermanent
	// ErrTypeUnknownTopic marks a send whose worker has no handler for the topic. It is
	// retried through the attempts (another worker, or this one after a deploy, may have
	// it), then dead-lettered.
	ErrTypeUnknownTopic = "OutboxUnknownTopic"
	// ErrTypeRetryable marks a send failure the downstream reported (5xx, 429): it did not
	// process the message, so the next attempt needs no check first.
	ErrTypeRetryable = dmsg.ErrTypeRetryable
	// ErrTypeAmbiguous marks a send failure after which the downstream may or may not have
	// the message (timeout, connection reset after the request was written).
	ErrTypeAmbiguous = dmsg.ErrTypeAmbiguous
	// ErrTypeStoreUnavailable marks a send that could not load the message because the
	// outbox's own database was unavailable: nothing was sent, and no attempt is used up.
	ErrTypeStoreUnavailable = "OutboxStoreUnavailable"
	// ErrTypeWrongDeployment marks a send or check that reached a worker of another
	// outbox (another database on the same task queue): that worker did nothing, and the
	// workflow asks again after a wait, for a worker of its own deployment, without using
	// up an attempt. A task queue belongs to one outbox database.
	ErrTypeWrongDeployment = "OutboxWrongDeployment"
	// ErrTypeNotAttempted marks a message of a batch that was not sent: the batch's send
	// timeout ran out before its turn. It leaves the batch with no attempt used.
	ErrTypeNotAttempted = "OutboxNotAttempted"
	// ErrTypeTopicPaused marks a send that found its topic paused (outbox topic pause):
	// nothing was sent, and the workflow waits for the resume without using up an
	// attempt.
	ErrTypeTopicPaused = "OutboxTopicPaused"
	// ErrTypeTopicBusy marks a send that its worker did not make because the topic had
	// as many sends running there as it may (worker.max_sends_per_topic): nothing was
	// sent, and the workflow waits and asks again without using up an attempt.
	ErrTypeTopicBusy = "OutboxTopicBusy"
)

// SearchStatus is a value of the OutboxStatus search attribute.
type SearchStatus string

// Values of the OutboxStatus search attribute.
const (
	SearchStatusDispatched SearchStatus = "dispatched"
	SearchStatusRetrying   SearchStatus = "retrying"
	// SearchStatusSent is set by runs of DeliveryVersion 2 and earlier; a run of version 3
	// or later that delivered its message completes, ExecutionStatus = 'Completed', and
	// keeps the status it had.
	SearchStatusSent SearchStatus = "sent"
	SearchStatusDead SearchStatus = "dead"
	// SearchStatusPaused marks a run whose send found its topic paused: it waits for the
	// resume without using up attempts. The status it had comes back when a send runs.
	SearchStatusPaused SearchStatus = "paused"
	// SearchStatusBatch marks an OutboxBatch run (the batch lane), which carries many
	// messages; its messages in trouble have runs of their own.
	SearchStatusBatch SearchStatus = "batch"
)

// Search attribute names (all Keyword).
const (
	SearchAttrTopic     = "OutboxTopic"
	SearchAttrStatus    = "OutboxStatus"
	SearchAttrMessageID = "OutboxMessageId"
)

// SearchAttributeNames lists the custom search attributes the outbox uses.
var SearchAttributeNames = []string{SearchAttrTopic, SearchAttrStatus, SearchAttrMessageID}

// WorkflowID returns the delivery workflow ID of a message.
func WorkflowID(messageID string) string { return WorkflowIDPrefix + messageID }

// Policy is a message's delivery policy, resolved once by the relay from the topic's
// config and the row's max_retry_times, and recorded in the workflow's input.
type Policy struct {
	// MaxAttempts is the number of sends before the message is dead-lettered; at least 1.
	// Defaults to 12.
	MaxAttempts int `json:"max_attempts"`
	// InitialInterval is the wait after the first failed attempt. Defaults to 1s.
	InitialInterval time.Duration `json:"initial_interval"`
	// BackoffCoefficient multiplies the wait after each further failure. Defaults to 2.
	BackoffCoefficient float64 `json:"backoff_coefficient"`
	// MaxInterval caps the wait between attempts, Retry-After included. Defaults to 5m,
	// or InitialInterval when that is longer.
	MaxInterval time.Duration `json:"max_interval"`
	// SendTimeout bounds one send attempt (the activity's start-to-close timeout).
	// Defaults to 30s.
	SendTimeout time.Duration `json:"send_timeout"`
	// MarkSentTimeout bounds the retries of mark-sent after a delivery. Defaults to 10m.
	MarkSentTimeout time.Duration `json:"mark_sent_timeout,omitempty"`
	// FirstAttempt says how a sink topic's first attempt runs: FirstAttemptLocal (the
	// default) as a local activity in the run's first workflow task, which records the
	// row sent in that same task when the downstream accepts; FirstAttemptActivity as a
	// regular activity, like every later attempt. A SendTimeout longer than
	// MaxLocalSendTimeout makes it a regular activity either way. Topics delivered by a
	// team's activity or workflow ignore it.
	FirstAttempt string `json:"first_attempt,omitempty"`
	// Activity, when set, delivers the message with a team's own activity on its own task
	// queue instead of the send activity and the topic's handler.
	Activity *ActivityHandler `json:"activity,omitempty"`
	// Workflow, when set, delivers the message by starting a team's workflow.
	Workflow *WorkflowHandler `json:"workflow,omitempty"`
	// Nexus, when set, delivers the message as an operation of a team's Nexus service,
	// through a Nexus endpoint (versions NexusVersion and later).
	Nexus *NexusHandler `json:"nexus,omitempty"`
	// Batch, when set, puts the topic in the batch lane: the relay hands its rows over in
	// batches, each to one OutboxBatch run (see Batch). A message's own run has none.
	Batch *BatchPolicy `json:"batch,omitempty"`
}

// WorkflowHandler is a topic's team workflow (see package sinks/teamworkflow).
type WorkflowHandler = teamworkflow.Config

// ActivitySignalWithStart signals (and if need be starts) a team's workflow for a topic
// whose WorkflowHandler has a Signal.
const ActivitySignalWithStart = "OutboxSignalWithStart"

// ActivityRecordFailure records a failed attempt of a team's activity or workflow start on
// the message's row (retry_times, last_error), as the send activity does for a sink.
const ActivityRecordFailure = "OutboxRecordFailure"

// RecordFailureInput is the input of the record-failure activity.
type RecordFailureInput struct {
	MessageID string `json:"message_id"`
	Topic     string `json:"topic"`
	Attempt   int    `json:"attempt"`
	Error     string `json:"error"`
	ErrType   string `json:"error_type"` // ErrTypePermanent, ErrTypeRetryable or ErrTypeAmbiguous
}

// SignalWithStartInput is the input of the signal activity (see package
// sinks/teamworkflow).
type SignalWithStartInput = teamworkflow.SignalInput

// DefaultWorkflowIDTemplate is the workflow ID of a started workflow when the topic sets
// none.
const DefaultWorkflowIDTemplate = teamworkflow.DefaultWorkflowIDTemplate

// IDReusePolicies maps the workflow_id_reuse values to Temporal's policies.
var IDReusePolicies = teamworkflow.IDReusePolicies

// NexusHandler is a topic's Nexus operation (see package sinks/teamnexus).
type NexusHandler = teamnexus.Config

// ActivityHandler is a topic's team activity (see package sinks/teamactivity).
type ActivityHandler = teamactivity.Config

// DefaultScheduleToStart is how long an attempt of a team's activity may wait for a
// worker when ActivityHandler.ScheduleToStart is zero.
const DefaultScheduleToStart = teamactivity.DefaultScheduleToStart

// Policy defaults.
const (
	// The defaults ride out a downstream outage of 10 minutes and more: waits of 1s, 2s,
	// 4s, ... capped at 5m, so the 12th attempt comes about 18 minutes after the first.
	DefaultMaxAttempts        = 12
	DefaultInitialInterval    = time.Second
	DefaultBackoffCoefficient = 2.0
	DefaultMaxInterval        = 5 * time.Minute
	DefaultSendTimeout        = 30 * time.Second
	DefaultMarkSentTimeout    = 10 * time.Minute
	DefaultFirstAttempt       = FirstAttemptLocal
)

// Values of Policy.FirstAttempt.
const (
	FirstAttemptLocal    = "local"
	FirstAttemptActivity = "activity"
)

// MaxLocalSendTimeout is the longest SendTimeout with which a first attempt runs as a
// local activity. A local activity holds its workflow task while it runs, so the relay
// starts such a run with a workflow task timeout that covers the send (see
// FirstTaskTimeout): a worker lost mid-send is noticed only when that timeout passes, and
// the server caps workflow task timeouts at two minutes. A topic with a longer timeout
// sends every attempt as a regular activity.
const MaxLocalSendTimeout = time.Minute

// DefaultWorkflowTaskTimeout is Temporal's workflow task timeout when a start sets none.
const DefaultWorkflowTaskTimeout = 10 * time.Second

// localSendMargin is what a first workflow task needs beside its local send: the send
// must end this long before the SDK would heartbeat the task (at 80 % of its timeout).
const localSendMargin = 2 * time.Second

// FirstTaskTimeout returns the workflow task timeout of a run whose first attempt runs as
// a local activity with sendTimeout: long enough that the task is never heartbeated while
// the send runs (the SDK heartbeats a task at 80 % of its timeout when a local activity is
// still running, and a send interrupted across a heartbeat would be run again on replay
// without the check that an interrupted first task gets). At least Temporal's default.
func FirstTaskTimeout(sendTimeout time.Duration) time.Duration {
	return max(DefaultWorkflowTaskTimeout, sendTimeout+sendTimeout/4+5*time.Second)
}

// localSendFits reports whether a local send of sendTimeout ends before the SDK
// heartbeats a workflow task of taskTimeout.
func localSendFits(taskTimeout, sendTimeout time.Duration) bool {
	return sendTimeout+localSendMargin <= taskTimeout*4/5
}

// MaxAttemptsLimit is the most attempts a policy may allow: the first and 100 retries, as
// a row's max_retry_times allows (store.MaxRetryTimesLimit).
const MaxAttemptsLimit = 101

// WithDefaults fills the zero fields of p.
func (p Policy) WithDefaults() Policy {
	p.MaxAttempts = cmp.Or(p.MaxAttempts, DefaultMaxAttempts)
	p.InitialInterval = cmp.Or(p.InitialInterval, DefaultInitialInterval)
	p.BackoffCoefficient = cmp.Or(p.BackoffCoefficient, DefaultBackoffCoefficient)
	p.MaxInterval = cmp.Or(p.MaxInterval, max(DefaultMaxInterval, p.InitialInterval))
	p.SendTimeout = cmp.Or(p.SendTimeout, DefaultSendTimeout)
	p.MarkSentTimeout = cmp.Or(p.MarkSentTimeout, DefaultMarkSentTimeout)
	p.FirstAttempt = cmp.Or(p.FirstAttempt, DefaultFirstAttempt)
	if p.Workflow != nil {
		w := p.Workflow.WithDefaults()
		p.Workflow = &w
	}
	if p.Activity != nil {
		a := p.Activity.WithDefaults(p.SendTimeout)
		p.Activity = &a
	}
	if p.Nexus != nil {
		n := p.Nexus.WithDefaults(p.SendTimeout)
		p.Nexus = &n
	}
	if p.Batch != nil {
		b := p.Batch.WithDefaults()
		p.Batch = &b
	}
	return p
}

// Validate reports the first field of p that is out of range.
func (p Policy) Validate() error {
	switch {
	case p.MaxAttempts < 1 || p.MaxAttempts > MaxAttemptsLimit:
		return fmt.Errorf("max_attempts must be between 1 and %d, got %d", MaxAttemptsLimit, p.MaxAttempts)
	case p.InitialInterval <= 0:
		return fmt.Errorf("initial_interval must be positive, got %s", p.InitialInterval)
	case math.IsNaN(p.BackoffCoefficient) || math.IsInf(p.BackoffCoefficient, 0):
		return fmt.Errorf("backoff must be a finite number, got %g", p.BackoffCoefficient)
	case p.BackoffCoefficient < 1:
		return fmt.Errorf("backoff must be at least 1, got %g", p.BackoffCoefficient)
	case p.MaxInterval < p.InitialInterval:
		return fmt.Errorf("max_interval must be at least initial_interval (%s), got %s", p.InitialInterval, p.MaxInterval)
	case p.SendTimeout <= 0:
		return fmt.Errorf("timeout must be positive, got %s", p.SendTimeout)
	case p.MarkSentTimeout < 0:
		return fmt.Errorf("mark_sent_timeout must not be negative, got %s", p.MarkSentTimeout)
	case p.FirstAttempt != FirstAttemptLocal && p.FirstAttempt != FirstAttemptActivity:
		return fmt.Errorf("first_attempt must be %s or %s, got %q", FirstAttemptLocal, FirstAttemptActivity, p.FirstAttempt)
	}
	if p.Workflow != nil && p.Activity != nil {
		return fmt.Errorf("activity and workflow cannot both deliver a topic")
	}
	if p.Nexus != nil && (p.Activity != nil || p.Workflow != nil) {
		return fmt.Errorf("nexus and activity or workflow cannot both deliver a topic")
	}
	if n := p.Nexus; n != nil {
		if err := n.Validate(); err != nil {
			return err
		}
	}
	if w := p.Workflow; w != nil {
		if err := w.Validate(); err != nil {
			return err
		}
	}
	if a := p.Activity; a != nil {
		if err := a.Validate(); err != nil {
			return err
		}
	}
	if b := p.Batch; b != nil {
		if p.DeliveredByTeam() {
			return fmt.Errorf("lane batch needs a sink in the outbox's worker: a team's activity, workflow or Nexus operation delivers one message per attempt")
		}
		if err := b.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// LocalFirstAttempt reports whether p sends a message's first attempt as a local activity
// in the run's first workflow task: a sink topic (not a team's activity or workflow) with
// FirstAttempt local and a SendTimeout of at most MaxLocalSendTimeout. The run decides it
// again from its input and its workflow task timeout (DeliveryInput.LocalFirstAttempt).
func (p Policy) LocalFirstAttempt() bool {
	p = p.WithDefaults()
	return !p.DeliveredByTeam() && p.FirstAttempt == FirstAttemptLocal && p.SendTimeout <= MaxLocalSendTimeout
}

// DeliveredByTeam reports whether a team's activity, workflow or Nexus operation delivers
// the topic, outside the outbox's worker, rather than a sink in it.
func (p Policy) DeliveredByTeam() bool {
	return p.Activity != nil || p.Workflow != nil || p.Nexus != nil
}

// Backoff returns the wait after failed attempt n (1-based): InitialInterval ×
// BackoffCoefficient^(n-1), capped by MaxInterval. The cap applies before the product
// becomes a Duration, which could not hold it.
func (p Policy) Backoff(n int) time.Duration {
	d := p.backoffProduct(n)
	if d >= float64(p.MaxInterval) {
		return p.MaxInterval
	}
	return time.Duration(d)
}

// BackoffOverflows reports whether the product of Backoff(n) is more than a Duration
// holds, where BackoffBeforeCap differs from it.
func (p Policy) BackoffOverflows(n int) bool {
	return p.backoffProduct(n) >= float64(math.MaxInt64)
}

// BackoffBeforeCap is Backoff(n) as runs recorded before the change to it computed it:
// the product converted to a Duration first, then capped, which on amd64 gives a negative
// wait for a product no Duration holds (the run then waits not at all). Only the delivery
// workflow's replay of such runs asks for it.
func (p Policy) BackoffBeforeCap(n int) time.Duration {
	return min(time.Duration(p.backoffProduct(n)), p.MaxInterval)
}

func (p Policy) backoffProduct(n int) float64 {
	d := float64(p.InitialInterval)
	for i := 1; i < n && d < float64(p.MaxInterval); i++ {
		d *= p.BackoffCoefficient
	}
	return d
}

// RetrySpan returns the longest time from the start of a message's first attempt to the
// end of its last: every attempt running out its SendTimeout, and every wait between them
// at its longest. A resend can come this long after the first send, so a broker that
// de-duplicates within a window needs a window at least this long.
func (p Policy) RetrySpan() time.Duration {
	p = p.WithDefaults()
	span := time.Duration(p.MaxAttempts) * p.SendTimeout
	for n := 1; n < p.MaxAttempts; n++ {
		span += p.Backoff(n)
	}
	return span
}

// DeliveryInput is the input of OutboxDelivery: a reference to the message, not its
// payload (the send activity loads it), and the resolved policy.
type DeliveryInput struct {
	MessageID string `json:"message_id"`
	Topic     string `json:"topic"`
	Policy    Policy `json:"policy"`
	// SearchAttributes says whether the workflow keeps OutboxStatus up to date.
	SearchAttributes bool `json:"search_attributes"`
	// CheckFirst says that a send may have happened before this run (the message was
	// handed over before, failed an attempt before, or was redriven): the run asks
	// check-processed before its first send.
	CheckFirst bool `json:"check_first,omitempty"`
	// Version is the version of OutboxDelivery the relay asks for; the relay sets
	// DeliveryVersion. A run whose input has a version takes the paths of that version
	// without recording a version marker (and the search attribute update that comes with
	// one). Runs started without it (by an older relay) decide each change with
	// workflow.GetVersion, as before.
	Version int `json:"version,omitempty"`
	// Deployment is the deployment ID of the outbox whose table holds the message
	// (store.Store.DeploymentID), set by the relay. A worker of another deployment refuses
	// the run's workflow tasks (see DeliveryOf) and its sends and checks
	// (ErrTypeWrongDeployment), so the message waits for a worker of its own database.
	// Empty (a run started by an older relay) skips these checks.
	Deployment string `json:"deployment,omitempty"`
	// Message is the message itself, for a topic delivered by a team's activity or
	// workflow, whose input it is: the relay reads it with the claim, so the run needs no
	// load step. Nil otherwise (and for a message handed over before, CheckFirst, whose
	// run reads its row to learn whether an earlier run delivered it). Versions 4 and
	// later.
	Message *dmsg.Message `json:"message,omitempty"`
	// OrderingKey is the message's ordering key when Message is set (for the workflow ID
	// template's {ordering_key}).
	OrderingKey string `json:"ordering_key,omitempty"`
	// Prior is the attempt a batch made of the message before it handed the message to
	// this run (versions 5 and later): the run goes on from it, with the backoff after
	// it, a check first when it was ambiguous, and the dead letter when it was permanent
	// or the last. Nil for a run the relay started.
	Prior *PriorAttempt `json:"prior,omitempty"`
}

// LocalFirstAttempt reports whether the run sends its first attempt as a local activity
// in its first workflow task (version 4 and later): its policy's LocalFirstAttempt, and
// no earlier delivery that may have sent the message (CheckFirst: the run asks first, and
// sends every attempt as a regular activity). The relay starts such a run with the
// workflow task timeout FirstTaskTimeout(Policy.SendTimeout).
func (in DeliveryInput) LocalFirstAttempt() bool {
	return in.Version >= 4 && !in.CheckFirst && in.Prior == nil && in.Policy.LocalFirstAttempt()
}

// DeliveryVersion is the version of OutboxDelivery this code starts: 2 takes every change
// guarded so far (bounded mark-sent; unknown topics retried and the last ambiguous attempt
// checked); 3 also leaves OutboxStatus alone when the message is delivered (a completed run
// is a sent message: one search-attribute upsert, one action, less per message); 4 sends a
// sink topic's first attempt as a local activity in the first workflow task
// (LocalFirstAttempt), skips mark-sent when the send recorded the row itself
// (SendResult.Recorded), and takes a team topic's message from its input
// (DeliveryInput.Message) instead of loading it: 2 actions for a message delivered at the
// first attempt, 3 for a team's activity or workflow; 5 adds the batch lane (OutboxBatch,
// and a delivery that goes on from a batch's attempt, DeliveryInput.Prior). The relay
// starts batches only while every worker on the task queue runs version 5; 6 adds topics
// delivered by a Nexus operation (Policy.Nexus), whose runs the relay always starts at
// version 6 or later, so that a worker of an older version leaves them to a newer one.
const DeliveryVersion = 6

// NexusVersion is the first DeliveryVersion with Nexus topics.
const NexusVersion = 6

// GuardVersion is the first DeliveryVersion whose workers leave a run of a newer version
// to a newer worker. A worker of an earlier one runs whatever it is given its own way, so
// no run is started above the version of every worker while one of those polls.
const GuardVersion = 4

// BatchVersion is the first DeliveryVersion with the batch lane.
const BatchVersion = 5

// DeliveryResult is the result of a delivery that completed.
type DeliveryResult struct {
	// Attempts is the number of sends made.
	Attempts int `json:"attempts"`
	// AlreadyProcessed is true when check-processed found that the downstream had the
	// message after an ambiguous failure, so it was not sent again.
	AlreadyProcessed bool `json:"already_processed"`
	// Unrecorded is true when the message was delivered but mark-sent kept failing until
	// MarkSentTimeout: the row is still dispatched, and the relay's reconciliation records
	// it sent from this completed run.
	Unrecorded bool `json:"unrecorded,omitempty"`
	// Started is the team's workflow the delivery started (or found started), for a topic
	// delivered by a workflow.
	Started *StartedWorkflow `json:"started,omitempty"`
}

// StartedWorkflow identifies a workflow a delivery started.
type StartedWorkflow = teamworkflow.Started

// SendInput is the input of the send activity.
type SendInput struct {
	MessageID   string `json:"message_id"`
	Topic       string `json:"topic"`
	Attempt     int    `json:"attempt"` // 1-based
	MaxAttempts int    `json:"max_attempts"`
	// Deployment is DeliveryInput.Deployment: the activity refuses a message of another
	// deployment with ErrTypeWrongDeployment.
	Deployment string `json:"deployment,omitempty"`
}

// SendResult is the result of the send activity (versions 4 and later read it).
type SendResult struct {
	// Recorded says that the row is recorded sent: the send recorded it when the handler
	// accepted the message, or found it sent by an earlier run. The run then needs no
	// mark-sent step.
	Recorded bool `json:"recorded,omitempty"`
}

// LoadMessageInput is the input of the load-message activity.
type LoadMessageInput struct {
	MessageID string `json:"message_id"`
}

// LoadMessageResult is the message a team's activity gets, and whether its row is
// already recorded sent (an earlier run delivered it).
type LoadMessageResult struct {
	Message     dmsg.Message `json:"message"`
	OrderingKey string       `json:"ordering_key,omitempty"`
	AlreadySent bool         `json:"already_sent,omitempty"`
	// Paused reports that the message's topic is paused (a run of a team's topic that
	// waits for the resume reads it).
	Paused bool `json:"paused,omitempty"`
}

// CheckProcessedInput is the input of the check-processed activity.
type CheckProcessedInput struct {
	MessageID string `json:"message_id"`
	Topic     string `json:"topic"`
	// Deployment is DeliveryInput.Deployment, checked as SendInput's is.
	Deployment string `json:"deployment,omitempty"`
}

// CheckProcessedResult says whether the downstream already has the message. Supported is
// false when the topic's handler cannot tell.
type CheckProcessedResult struct {
	Supported bool `json:"supported"`
	Processed bool `json:"processed"`
}

// MarkSentInput is the input of the mark-sent activity.
type MarkSentInput struct {
	MessageID string `json:"message_id"`
	Attempts  int    `json:"attempts"`
	// TeamAttempt is set after an attempt of a team's activity, workflow or Nexus
	// operation delivered the message: no send activity of the outbox ran it, so the
	// mark-sent step counts the attempt (outbox_send_attempts_total) when it records the
	// row sent.
	TeamAttempt bool `json:"team_attempt,omitempty"`
}

// DeadLetterInput is the input of the dead-letter activity.
type DeadLetterInput struct {
	MessageID  string `json:"message_id"`
	Topic      string `json:"topic"`
	WorkflowID string `json:"workflow_id"`
	RunID      string `json:"run_id"`
	Attempts   int    `json:"attempts"`
	LastError  string `json:"last_error"`
}

// DeadLetterResult is what the dead-letter step found. AlreadySent reports a row that was
// recorded sent (by this run's own send, whose answer was lost), which gets no dead
// letter. A dead-letter step of an earlier release returns nothing: false.
type DeadLetterResult struct {
	AlreadySent bool `json:"already_sent,omitempty"`
}

// ResolvePolicy returns the policy of one message: the topic's policy with defaults
// filled, and when the row sets max_retry_times, MaxAttempts = max_retry_times + 1 (0 =
// one attempt), which wins over the topic's max_attempts.
func ResolvePolicy(topic Policy, maxRetryTimes *int) Policy {
	p := topic.WithDefaults()
	if maxRetryTimes != nil {
		p.MaxAttempts = *maxRetryTimes + 1
	}
	return p
}
