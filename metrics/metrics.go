// Package metrics holds the outbox's Prometheus metrics: what the relay claims and starts,
// what the activities send, dead-letter and fail, how long a message takes from its
// commit to its delivery, and (through [NewBacklogCollector]) how many messages wait for
// a relay.
//
// A nil *Metrics is valid and records nothing, so the relay and the activities take an
// optional one:
//
//	registry := prometheus.NewRegistry()
//	m, err := metrics.New(registry)
//	...
//	registry.MustRegister(metrics.NewBacklogCollector(st, 0))
//	relay, err := starter.New(st, pool, c, starter.Config{Metrics: m})
//	worker.Register(w, worker.Deps{Store: st, Handlers: handlers, Metrics: m})
//
// # Names
//
// Every series starts with outbox_; counters end in _total and durations are in seconds.
// Labels are topic (the message's topic when it is one of the topics declared with
// [Metrics.KnownTopics], else [OtherTopic], so rows cannot grow the series without
// bound), kind (a send failure's class: permanent, unknown_topic, retryable, ambiguous or
// other) and operation (see [Metrics.Error]).
package metrics

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-go/outbox/workflows"
)

// Operations counted by outbox_errors_total.
const (
	OpClaim            = "claim"             // the relay's claim query failed
	OpStartWorkflow    = "start_workflow"    // a workflow start failed
	OpDescribeWorkflow = "describe_workflow" // a started workflow could not be described
	OpMarkDispatched   = "mark_dispatched"   // a started row could not be marked dispatched
	OpMarkSent         = "mark_sent"         // the mark-sent activity failed
	OpDeadLetter       = "dead_letter"       // the dead-letter activity failed
	OpRecordFailure    = "record_failure"    // a failed attempt could not be recorded on its row
	OpDeadLetterRuns   = "dead_letter_runs"  // the runs that dead-lettered a message could not be read
	OpRetryClaim       = "retry_claim"       // a claimed row could not be set to be claimed again soon
)

var operations = []string{OpClaim, OpStartWorkflow, OpDescribeWorkflow, OpMarkDispatched, OpMarkSent, OpDeadLetter, OpRecordFailure,
	OpDeadLetterRuns, OpRetryClaim}

// Metrics records the outbox's metrics. Its methods are safe for concurrent use and do
// nothing on a nil *Metrics.
type Metrics struct {
	claimed        prometheus.Counter
	started        prometheus.Counter
	alreadyStarted prometheus.Counter
	batchSize      prometheus.Histogram
	batchDuration  prometheus.Histogram
	sendAttempts   *prometheus.CounterVec
	sendFailures   *prometheus.CounterVec
	sendDuration   *prometheus.HistogramVec
	sent           *prometheus.CounterVec
	commitToSent   *prometheus.HistogramVec
	deadLettered   *prometheus.CounterVec
	redriven       *prometheus.CounterVec
	reconciled     *prometheus.CounterVec
	errors         *prometheus.CounterVec
	signalClosed   *prometheus.CounterVec
	connLost       *prometheus.CounterVec
	sinkReady      *prometheus.GaugeVec
	batches        *prometheus.CounterVec
	batchMessages  *prometheus.HistogramVec
	batchOutcomes  *prometheus.CounterVec

	mu    sync.RWMutex
	known map[string]bool
}

// OtherTopic is the topic label of every topic not declared with KnownTopics. No topic
// can take it: topic names are letters, digits, '.', '_' and '-'.
const OtherTopic = "(other)"

// KnownTopics declares topics whose series carry their own name; the series of any other
// topic a row names are counted under OtherTopic. The worker and the relay declare the
// configured topics and those with a handler of their own.
func (m *Metrics) KnownTopics(topics ...string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range topics {
		m.known[t] = true
	}
}

// topic returns the label of topic.
func (m *Metrics) topic(topic string) string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.known[topic] {
		return topic
	}
	return OtherTopic
}

// New returns the outbox's metrics, registered with reg. Register them once per
// registry: a process that runs the relay and the worker shares one *Metrics.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		known: map[string]bool{},
		signalClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_signal_target_closed_total",
			Help: "Signals not delivered because the target workflow had closed and workflow_id_reuse let no new run start (each is dead-lettered), by topic.",
		}, []string{"topic"}),
		connLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_send_connection_lost_total",
			Help: "Send attempts that failed because their broker connection broke, not because of their message (each is sent again), by topic.",
		}, []string{"topic"}),
		sinkReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "outbox_sink_ready",
			Help: "1 when the worker's sink of a topic is connected, 0 while it cannot reach its broker (sends are retried until it can).",
		}, []string{"topic"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_batches_started_total",
			Help: "Batch runs (OutboxBatch) the relay started for the topics of the batch lane, by topic.",
		}, []string{"topic"}),
		batchMessages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_batch_messages",
			Help:    "Messages in each batch run the relay started, by topic.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}, []string{"topic"}),
		batchOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_batch_messages_total",
			Help: "Messages of batch runs by what they came to (sent by the batch; handed_over to a run of their own after a failed attempt; skipped, already sent or another batch's), by topic: the batch lane's throughput and hand-overs.",
		}, []string{"topic", "outcome"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_messages_claimed_total",
			Help: "Rows the relay claimed (a row claimed again after its lease expired counts again).",
		}),
		started: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_workflows_started_total",
			Help: "Delivery workflows the relay started.",
		}),
		alreadyStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_workflows_already_started_total",
			Help: "Workflow starts that met an existing run of the message's workflow.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_relay_batch_size",
			Help:    "Rows in each non-empty claim of the relay.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_relay_batch_duration_seconds",
			Help:    "Time from the start of a non-empty claim until every row of the batch was handed to Temporal.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		sendAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_send_attempts_total",
			Help: "Send attempts, by topic.",
		}, []string{"topic"}),
		sendFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_send_failures_total",
			Help: "Failed send attempts, by topic and kind (permanent, unknown_topic, retryable, ambiguous, other).",
		}, []string{"topic", "kind"}),
		sendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_send_duration_seconds",
			Help:    "Time the topic's handler took for one send attempt of the message lane (its request, publish or team activity call), whatever its outcome, by topic.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"topic"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_messages_sent_total",
			Help: "Messages recorded as sent, by topic.",
		}, []string{"topic"}),
		commitToSent: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_commit_to_sent_seconds",
			Help:    "Time from a message's created_at to its mark-sent, by topic (database clock).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}, []string{"topic"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_messages_dead_lettered_total",
			Help: "Messages moved to the dead-letter table, by topic.",
		}, []string{"topic"}),
		redriven: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_messages_redriven_total",
			Help: "Dead letters redriven to pending, by topic.",
		}, []string{"topic"}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_reconciled_total",
			Help: "Dispatched rows reconciliation repaired, by outcome (recorded_sent, handed_over_again).",
		}, []string{"outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_errors_total",
			Help: "Failed internal operations, by operation (claim, start_workflow, describe_workflow, mark_dispatched, mark_sent, dead_letter, record_failure).",
		}, []string{"operation"}),
	}
	for _, op := range operations {
		m.errors.WithLabelValues(op)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{
			m.claimed, m.started, m.alreadyStarted, m.batchSize, m.batchDuration, m.sendAttempts,
			m.sendFailures, m.sendDuration, m.sent, m.commitToSent, m.deadLettered, m.redriven, m.reconciled, m.errors,
			m.signalClosed, m.connLost, m.sinkReady, m.batches, m.batchMessages, m.batchOutcomes,
		} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register outbox metrics: %w", err)
			}
		}
	}
	return m, nil
}

// BatchStarted records a batch run of n messages of topic that the relay started.
func (m *Metrics) BatchStarted(topic string, n int) {
	if m == nil {
		return
	}
	t := m.topic(topic)
	m.batches.WithLabelValues(t).Inc()
	m.batchMessages.WithLabelValues(t).Observe(float64(n))
}

// Batch outcomes, the values of outbox_batch_messages_total's outcome label.
const (
	BatchOutcomeSent       = "sent"
	BatchOutcomeHandedOver = "handed_over"
	BatchOutcomeSkipped    = "skipped"
)

// BatchMessages counts n messages of a batch of topic that came to outcome (a
// BatchOutcome* value).
func (m *Metrics) BatchMessages(topic, outcome string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.batchOutcomes.WithLabelValues(m.topic(topic), outcome).Add(float64(n))
}

// Batch records one non-empty claim of n rows that took d from the claim until every row
// was handed over.
func (m *Metrics) Batch(n int, d time.Duration) {
	if m == nil || n <= 0 {
		return
	}
	m.claimed.Add(float64(n))
	m.batchSize.Observe(float64(n))
	m.batchDuration.Observe(d.Seconds())
}

// WorkflowStarted records a delivery workflow the relay started.
func (m *Metrics) WorkflowStarted() {
	if m != nil {
		m.started.Inc()
	}
}

// WorkflowAlreadyStarted records a start that met an existing run.
func (m *Metrics) WorkflowAlreadyStarted() {
	if m != nil {
		m.alreadyStarted.Inc()
	}
}

// SendAttempt records the start of a send attempt.
func (m *Metrics) SendAttempt(topic string) {
	if m != nil {
		m.sendAttempts.WithLabelValues(m.topic(topic)).Inc()
	}
}

// SendDuration records how long the handler of topic took for one send attempt.
func (m *Metrics) SendDuration(topic string, d time.Duration) {
	if m != nil {
		m.sendDuration.WithLabelValues(m.topic(topic)).Observe(d.Seconds())
	}
}

// SendFailed records a failed send attempt whose ApplicationError has type errType (one of
// the workflows.ErrType constants).
func (m *Metrics) SendFailed(topic, errType string) {
	if m != nil {
		m.sendFailures.WithLabelValues(m.topic(topic), FailureKind(errType)).Inc()
	}
}

// FailureKind maps an ApplicationError type to the kind label of
// outbox_send_failures_total.
func FailureKind(errType string) string {
	switch errType {
	case workflows.ErrTypePermanent:
		return "permanent"
	case workflows.ErrTypeUnknownTopic:
		return "unknown_topic"
	case workflows.ErrTypeRetryable:
		return "retryable"
	case workflows.ErrTypeAmbiguous:
		return "ambiguous"
	case workflows.ErrTypeStoreUnavailable:
		return "store_unavailable"
	default:
		return "other"
	}
}

// Sent records a message marked sent; commitToSent is the time from its created_at to
// its sent_at, and is not observed when negative.
func (m *Metrics) Sent(topic string, commitToSent time.Duration) {
	if m == nil {
		return
	}
	m.sent.WithLabelValues(m.topic(topic)).Inc()
	if commitToSent >= 0 {
		m.commitToSent.WithLabelValues(m.topic(topic)).Observe(commitToSent.Seconds())
	}
}

// DeadLettered records a message moved to the dead-letter table.
func (m *Metrics) DeadLettered(topic string) {
	if m != nil {
		m.deadLettered.WithLabelValues(m.topic(topic)).Inc()
	}
}

// Redriven records a dead letter of topic sent back to pending.
func (m *Metrics) Redriven(topic string) {
	if m != nil {
		m.redriven.WithLabelValues(m.topic(topic)).Inc()
	}
}

// Error records a failed operation; op is one of the Op constants.
func (m *Metrics) Error(op string) {
	if m != nil {
		m.errors.WithLabelValues(op).Inc()
	}
}

// Reconciled counts a row reconciliation repaired.
func (m *Metrics) Reconciled(outcome string) {
	if m != nil {
		m.reconciled.WithLabelValues(outcome).Inc()
	}
}

// SignalTargetClosed records a signal of topic whose target workflow had closed and could
// not start again.
func (m *Metrics) SignalTargetClosed(topic string) {
	if m != nil {
		m.signalClosed.WithLabelValues(m.topic(topic)).Inc()
	}
}

// ConnectionLost records a send attempt of topic that failed with its broker connection.
func (m *Metrics) ConnectionLost(topic string) {
	if m != nil {
		m.connLost.WithLabelValues(m.topic(topic)).Inc()
	}
}

// SinkReady sets whether the sink that serves name (a topic, or "default" for the
// default entry) is connected.
func (m *Metrics) SinkReady(name string, ready bool) {
	if m == nil {
		return
	}
	v := 0.0
	if ready {
		v = 1
	}
	m.sinkReady.WithLabelValues(name).Set(v)
}
