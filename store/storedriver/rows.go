package storedriver

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Row is one outbox_messages row as the relay and the activities see it.
type Row struct {
	ID            int64
	MessageID     uuid.UUID
	Topic         string
	Payload       json.RawMessage
	Headers       map[string]string
	Status        Status
	RetryTimes    int
	MaxRetryTimes *int
	NextRetryAt   *time.Time
	LastError     *string
	RedriveCount  int
	CreatedAt     time.Time
	UpdatedAt     time.Time
	SentAt        *time.Time
	OrderingKey   *string
	OrderingSeq   *int64
	// BatchID is the workflow ID of the OutboxBatch run the row was handed to (a topic of
	// the batch lane); nil for a row of the message lane.
	BatchID *string
	// Paused reports that the row's topic is paused (see Operations.PauseTopic): a
	// message not yet handed over waits for the resume, and a send of one handed over
	// earlier waits without using an attempt.
	Paused bool
	// HeldBack reports that the claim parked the row (held_back): a keyed row waits for
	// the earlier messages of its key, a row of a paused topic for the resume, and any
	// other row for room under its topic's limit of messages in flight. The relays unpark
	// it when that ends.
	HeldBack bool
}

// Claimed is a row a relay has claimed: it holds the row's lease until LeaseUntil and
// proves it with ClaimToken.
type Claimed struct {
	ID            int64
	MessageID     uuid.UUID
	Topic         string
	RetryTimes    int
	MaxRetryTimes *int
	RedriveCount  int
	CreatedAt     time.Time
	// DispatchedAt is when a workflow last took the message over; nil for a message
	// handed over for the first time.
	DispatchedAt *time.Time
	ClaimToken   uuid.UUID
	LeaseUntil   time.Time
	// Batch is the workflow ID of the batch run the row was handed to: read by the claim
	// (the row's batch_id, when a batch had it before), or set by a relay that hands the
	// row to a batch, which MarkDispatchedAll records. Empty for the message lane.
	Batch string
	// BatchAtClaim is the row's batch_id as the claim read it. A batch run that takes the
	// row after the claim (an earlier claim's batch, whose send came late) holds it:
	// MarkDispatchedAll then leaves the row to that batch rather than hand it to another
	// run as well.
	BatchAtClaim string
}

// BatchTake is a message a batch run takes (Delivery.TakeForBatch), with the token of the
// claim that handed it to the batch.
type BatchTake struct {
	MessageID uuid.UUID
	// ClaimToken is the claim's token; uuid.Nil when unknown (a batch started by a relay
	// of an earlier release), and then a claimed row that names no batch is taken whoever
	// holds it.
	ClaimToken uuid.UUID
}

// MayHaveBeenSent reports whether an earlier delivery of the message may have reached the
// downstream: it was handed over to a workflow or a batch before, failed an attempt
// before, or was redriven. Its next run then asks check-processed before it sends.
func (c Claimed) MayHaveBeenSent() bool {
	return c.DispatchedAt != nil || c.RetryTimes > 0 || c.RedriveCount > 0 || c.Batch != ""
}

// ClaimResult is what one claim did.
type ClaimResult struct {
	// Claimed are the rows now leased to the caller.
	Claimed []Claimed
	// Parked counts the rows the claim took off its path instead of claiming them: keyed
	// rows held back behind an earlier message of their key, rows of a paused topic, and
	// rows of a topic at its limit of messages in flight. Claimed plus Parked equal to the
	// limit means more rows may be due.
	Parked int
	// Limited counts those of Parked that their topic's limit of messages in flight
	// (OrderingRules.MaxInFlight) held back: the claim unparks them, oldest first, once
	// the topic has room.
	Limited int
	// Waiting reports that rows parked for their topic's limit are waiting for room (of
	// topics not paused), found by this claim or by the unparking before it: a relay
	// claims again soon, to hand them over as the topics' messages finish.
	Waiting bool
	// Full lists the topics this claim found at their limit.
	Full []string
}

// Sent describes a message that RecordSent or RecordSentAll moved to sent.
type Sent struct {
	MessageID uuid.UUID
	Topic     string
	// Latency is from the row's created_at (its transaction's start) to sent_at.
	Latency time.Duration
}

// DeadLetter is the record of a message whose delivery gave up.
type DeadLetter struct {
	MessageID  uuid.UUID
	Topic      string // used when the message row no longer exists
	WorkflowID string
	RunID      string
	Attempts   int
	LastError  string
}

// DeadLetterRecord is one row of outbox_dead_letters.
type DeadLetterRecord struct {
	ID               int64
	MessageID        uuid.UUID
	WorkflowID       string
	RunID            string
	Topic            string
	Payload          json.RawMessage
	Headers          map[string]string
	Attempts         int
	LastError        string
	MessageCreatedAt *time.Time
	DeadLetteredAt   time.Time
	RedrivenAt       *time.Time
	RedrivenBy       *string
	DiscardedAt      *time.Time
	DiscardedBy      *string
}

// OrderingRules are the settings the claim applies to each topic's messages: the order
// of keyed messages, and how many of a topic's messages may be in flight at once. The
// zero value orders every keyed message, lets a dead message block its key, and sets no
// limit.
type OrderingRules struct {
	// MaxInFlight is the most messages of one topic in flight at once: dispatched (a run
	// owns them, until it records them sent or dead) or claimed under a lease. A claim
	// parks a topic's due rows beyond it, keeping them off its path at no cost, and
	// unparks them oldest first as the topic's messages finish, so a topic with a large
	// backlog cannot fill the workers' queue ahead of every other topic. Rows with an
	// ordering key count as in flight but are never parked for the limit (their key
	// already lets one through at a time). Concurrent claims of several relays can each
	// fill a topic's room, so a topic may briefly hold a few claims' rows more. 0 sets no
	// limit.
	MaxInFlight int
	// TopicMaxInFlight overrides MaxInFlight for the topics it lists; 0 or less sets no
	// limit for the topic.
	TopicMaxInFlight map[string]int
	// Listed are the topics the settings below name one by one; every other topic takes
	// the defaults.
	Listed []string
	// Unordered are the listed topics whose messages are never held back by their key.
	Unordered []string
	// DefaultUnordered applies to topics not listed.
	DefaultUnordered bool
	// Skipping are the listed topics whose dead messages do not block their key: later
	// messages of the key are delivered anyway.
	Skipping []string
	// DefaultSkipping applies to topics not listed.
	DefaultSkipping bool
}

// InFlightLimit returns topic's limit of messages in flight: its TopicMaxInFlight, or
// MaxInFlight; 0 for none.
func (o OrderingRules) InFlightLimit(topic string) int {
	n, ok := o.TopicMaxInFlight[topic]
	if !ok {
		n = o.MaxInFlight
	}
	return max(n, 0)
}

// LimitsInFlight reports whether any topic has a limit of messages in flight.
func (o OrderingRules) LimitsInFlight() bool {
	if o.MaxInFlight > 0 {
		return true
	}
	for _, n := range o.TopicMaxInFlight {
		if n > 0 {
			return true
		}
	}
	return false
}

// Dispatched is a row a workflow owns.
type Dispatched struct {
	ID           int64
	MessageID    uuid.UUID
	Topic        string
	DispatchedAt time.Time
	UpdatedAt    time.Time
	// BatchID is the batch run the row was handed to, when its topic is of the batch lane
	// (Row.BatchID): the row's run is then that one, or the message's own run once the
	// batch handed the message over.
	BatchID *string
}

// ReconcileOutcome is what reconciliation found for a dispatched row, as recorded in the
// audit trail.
type ReconcileOutcome string

// Reconcile outcomes.
const (
	// ReconcileRunning: the workflow is still running; the row is left as it is.
	ReconcileRunning ReconcileOutcome = "running"
	// ReconcileRecordedSent: the workflow completed but the row was not recorded sent.
	ReconcileRecordedSent ReconcileOutcome = "recorded_sent"
	// ReconcileHandedOverAgain: the workflow is missing or closed without delivering; the
	// row is pending again and a relay starts a new run.
	ReconcileHandedOverAgain ReconcileOutcome = "handed_over_again"
)

// NotDeadError reports an operator action on a message that is not dead-lettered.
type NotDeadError struct {
	MessageID uuid.UUID
	Status    Status
}

func (e *NotDeadError) Error() string {
	hint := ""
	switch e.Status {
	case StatusPending, StatusClaimed, StatusDispatched:
		hint = " (it is being delivered; was it redriven already?)"
	case StatusSent:
		hint = " (it was delivered)"
	case StatusDiscarded:
		hint = " (an operator gave up on it)"
	}
	return fmt.Sprintf("message %s is %s, not dead%s: only dead-lettered messages can be redriven or discarded", e.MessageID, e.Status, hint)
}

// DeadLetterChangedError reports an operator action on a dead letter chosen from a list
// that is no longer the message's one open dead letter: the message was redriven,
// discarded or dead-lettered again since the list was read. Nothing was changed.
type DeadLetterChangedError struct {
	MessageID    uuid.UUID
	DeadLetterID int64
}

func (e *DeadLetterChangedError) Error() string {
	return fmt.Sprintf("message %s: dead letter %d is no longer its open dead letter (the message was redriven, discarded or dead-lettered again since it was selected): select again",
		e.MessageID, e.DeadLetterID)
}

// DeadLetterFilter selects dead letters. The zero value selects every open one.
type DeadLetterFilter struct {
	// Topic, when set, selects one topic.
	Topic string
	// Since, when set, selects dead letters written at or after it.
	Since time.Time
	// Until, when set, selects dead letters written before it.
	Until time.Time
	// Error, when set, selects dead letters whose last error contains it, compared
	// without regard to case.
	Error string
	// Limit caps the rows returned; 0 means 100.
	Limit int
	// IncludeClosed also returns dead letters already redriven or discarded. By default
	// only open ones are returned: those whose message is still dead.
	IncludeClosed bool
}

// AuditEntry is one operator action on a message.
type AuditEntry struct {
	MessageID    uuid.UUID
	DeadLetterID *int64
	Action       string // "redrive", "discard" or "reconcile"
	Actor        string
	At           time.Time
	Detail       *string // what reconciliation found
}

// Redriven is the outcome of a redrive.
type Redriven struct {
	MessageID    uuid.UUID
	Topic        string
	RedriveCount int
}

// Stats is a snapshot of the outbox tables.
type Stats struct {
	// ByStatus counts messages per status; every status is present.
	ByStatus map[Status]int64 `json:"by_status"`
	// ByTopic counts messages per topic and status (statuses with no message left out).
	ByTopic map[string]map[Status]int64 `json:"by_topic"`
	// OldestPendingAge is the age of the oldest message that is due and waits for a relay
	// (zero when there is none): how long the relays are behind. It is pending, or
	// claimed under a lease that ran out (its relay died). A message of a paused topic,
	// or held back behind its ordering key, is not due; one waiting for room under its
	// topic's limit of messages in flight is.
	OldestPendingAge time.Duration `json:"oldest_pending_age_ns"`
	// InFlight counts messages handed to Temporal (or being handed) but not finished:
	// dispatched, and claimed under a live lease (a claimed row whose lease ran out, or
	// that a claim parked, waits for a relay).
	InFlight int64 `json:"in_flight"`
	// OldestInFlightAge is the time since the oldest in-flight message was handed over
	// (dispatched_at; for one claimed under a live lease, since it was claimed; a claim
	// whose lease ran out counts in OldestPendingAge). Reconciliation's checks
	// do not reset it, so a run that never finishes keeps growing older here.
	OldestInFlightAge time.Duration `json:"oldest_in_flight_age_ns"`
	// OpenDeadLetters counts dead letters neither redriven nor discarded.
	OpenDeadLetters int64 `json:"open_dead_letters"`
	// DeadLettersLastHour and DeadLettersLastDay count dead letters written in that time.
	DeadLettersLastHour int64 `json:"dead_letters_last_hour"`
	DeadLettersLastDay  int64 `json:"dead_letters_last_day"`
	// HeldBack counts pending messages waiting behind an earlier undelivered message of
	// their ordering key.
	HeldBack int64 `json:"held_back"`
	// KeysBlockedByDead counts ordering keys whose earliest undelivered message is dead
	// while later messages of the key wait (unless its topic skips dead messages).
	KeysBlockedByDead int64 `json:"keys_blocked_by_dead"`
	// RepairedLastDay counts rows reconciliation repaired in the last day.
	RepairedLastDay int64 `json:"repaired_last_day"`
	// Paused lists the paused topics, by topic.
	Paused []TopicPause `json:"paused_topics"`
	// At is the database time of the snapshot.
	At time.Time `json:"at"`
}

// TopicBacklog is one topic's rows not yet handed to Temporal: Pending counts them,
// OldestAge is the age (since created_at) of the oldest of them that is due and not held
// back behind its ordering key, zero when none is.
type TopicBacklog struct {
	Topic     string
	Pending   int64
	OldestAge time.Duration
	// Paused reports that the topic is paused: its rows wait for the resume. A paused
	// topic is listed even when none of its rows waits.
	Paused bool
}

// TopicPause is a paused topic: who paused it, when and why.
type TopicPause struct {
	Topic    string    `json:"topic"`
	PausedAt time.Time `json:"paused_at"`
	PausedBy string    `json:"paused_by"`
	Reason   string    `json:"reason,omitempty"`
}

// TotalBacklog adds up the topics' backlogs: all their rows, the oldest of their ages.
func TotalBacklog(topics []TopicBacklog) (pending int64, oldestAge time.Duration) {
	for _, b := range topics {
		pending += b.Pending
		oldestAge = max(oldestAge, b.OldestAge)
	}
	return pending, oldestAge
}

// WithPaused returns backlog with the paused topics marked: a paused topic without
// waiting rows is added, and a paused topic's OldestAge is zero, since none of its rows is
// due while the pause lasts. The topics then come in byte order.
func WithPaused(backlog []TopicBacklog, paused []TopicPause) []TopicBacklog {
	if len(paused) == 0 {
		return backlog
	}
	isPaused := make(map[string]bool, len(paused))
	for _, p := range paused {
		isPaused[p.Topic] = true
	}
	out := make([]TopicBacklog, 0, len(backlog)+len(paused))
	for _, b := range backlog {
		if isPaused[b.Topic] {
			b.Paused, b.OldestAge = true, 0
			delete(isPaused, b.Topic)
		}
		out = append(out, b)
	}
	for topic := range isPaused {
		out = append(out, TopicBacklog{Topic: topic, Paused: true})
	}
	slices.SortFunc(out, func(a, b TopicBacklog) int { return strings.Compare(a.Topic, b.Topic) })
	return out
}
