// Package storedriver holds what every outbox store shares, without a database driver:
// the interfaces the relay, the worker and the commands use (Delivery, Operations,
// Driver), the message and its rows, their statuses, and the checks a message passes
// before any store writes it. Package github.com/outbox-go/outbox/store (PostgreSQL) and
// package github.com/outbox-go/outbox/store/mysqlstore (MySQL and MariaDB) implement the
// interfaces; package store names every type of this one too, so code on PostgreSQL
// imports store alone. It is a module of its own, so that a team on MySQL has no
// PostgreSQL driver in its module graph, and a team on PostgreSQL no MySQL one.
package storedriver

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// The outbox talks to its database through the interfaces below, one per audience, so that
// the relay, the worker and the commands run unchanged on every database the outbox
// supports. store.Store is the PostgreSQL implementation, mysqlstore.Store the MySQL and
// MariaDB one. Both pass the shared conformance suite in package
// github.com/outbox-go/outbox/store/storedriver/storetest.
//
// Business code sees none of these interfaces: it calls the Enqueue of its database's
// store (store.Store.Enqueue with a pgx.Tx or store.SQLTx, mysqlstore.Store.Enqueue with
// a *sql.Tx) in its own transaction, or takes the store as that package's Enqueuer,
// which has the enqueue methods only.

// Delivery is what the delivery machinery needs from the database: the relay's claim and
// hand-over, the worker's activities (record sent, record a failure, dead-letter),
// reconciliation, retention and the backlog metric. Every status transition of a row
// goes through one method of it (see the package documentation for which).
type Delivery interface {
	// Kind names the database: "postgres" or "mysql".
	Kind() string
	// Schema names where the outbox tables live: the PostgreSQL schema, or the MySQL
	// database. It appears in error messages and logs.
	Schema() string
	// MaxPayloadBytes is the payload size limit the store enforces.
	MaxPayloadBytes() int
	// Validate reports what is wrong with msg as a *ValidationError, or nil.
	Validate(msg Message) error

	// ClaimBatch leases up to limit due rows for lease, holding back keyed rows behind
	// an earlier undelivered message of their key (see OrderingRules). An error from a
	// step after the claim committed comes with the result so far: its Claimed rows are
	// leased, and the caller hands them over as after no error.
	ClaimBatch(ctx context.Context, limit int, lease time.Duration, rules OrderingRules) (ClaimResult, error)
	// MarkDispatchedAll records that workflows took the claimed rows over
	// (claimed → dispatched), with the batch run of each row that has one
	// (Claimed.Batch), and returns how many rows it moved.
	MarkDispatchedAll(ctx context.Context, rows []Claimed) (int, error)
	// RetryClaimAfter gives a claimed row back, due again after d.
	RetryClaimAfter(ctx context.Context, id int64, token uuid.UUID, d time.Duration) (ok bool, err error)
	// Unpark releases held-back rows whose key has nothing undelivered before them.
	Unpark(ctx context.Context, rules OrderingRules) (int64, error)
	// NextDue is the wait until the earliest delayed row falls due, by the database
	// clock; ok is false when no row is waiting for its time.
	NextDue(ctx context.Context) (wait time.Duration, ok bool, err error)

	// Get returns one message, or an error wrapping ErrNotFound.
	Get(ctx context.Context, messageID uuid.UUID) (Row, error)
	// GetAll returns the messages of messageIDs that exist.
	GetAll(ctx context.Context, messageIDs []uuid.UUID) (map[uuid.UUID]Row, error)
	// MarkSent records a message sent by a run the relay found completed.
	MarkSent(ctx context.Context, messageID uuid.UUID) (ok bool, err error)
	// RecordSent records a message sent and returns its row's timestamps, or nil when
	// it was sent already or is dead.
	RecordSent(ctx context.Context, messageID uuid.UUID) (*Sent, error)
	// TakeForBatch records batch as the batch of the rows of messages that are claimed and
	// name this batch, or name none and are still held by the claim that handed them to it
	// (BatchTake.ClaimToken), or that are dispatched to this batch; it returns the IDs of
	// the rows that name it now: those the batch run may send. A row dispatched without a
	// batch has a run of its own, which sends it; a row claimed again since has its next
	// claim's hand-over, which sends it.
	TakeForBatch(ctx context.Context, batch string, messages []BatchTake) ([]uuid.UUID, error)
	// RecordSentAll records many messages sent in one statement (a batch run's delivered
	// messages) and returns the rows it moved; rows sent already, dead or missing are left
	// out.
	RecordSentAll(ctx context.Context, messageIDs []uuid.UUID) ([]Sent, error)
	// RecordFailure counts a failed attempt and keeps its error on the row.
	RecordFailure(ctx context.Context, messageID uuid.UUID, failedAttempts int, lastError string) (ok bool, err error)
	// DeadLetter moves a message to dead and writes its dead letter, in one transaction.
	DeadLetter(ctx context.Context, d DeadLetter) (ok bool, err error)
	// DeadLetterRunIDs lists the runs that dead-lettered a message.
	DeadLetterRunIDs(ctx context.Context, messageID uuid.UUID) ([]string, error)

	// ClaimStaleDispatched takes dispatched rows not updated for age, for reconciliation.
	ClaimStaleDispatched(ctx context.Context, age time.Duration, limit int) ([]Dispatched, error)
	// Repair applies what reconciliation found for a dispatched row.
	Repair(ctx context.Context, d Dispatched, outcome ReconcileOutcome, detail string) (ok bool, err error)

	// PurgeBatch removes (or archives) one batch of old sent and discarded messages.
	PurgeBatch(ctx context.Context, opts PurgeOptions) (PurgeResult, error)
	// Backlog counts, by topic, the rows not yet handed to Temporal (pending or claimed,
	// held back or not) and the age of the oldest due one (zero when none), for the
	// outbox_messages_pending metrics. Topics without such rows are left out; the
	// topics come in order.
	Backlog(ctx context.Context) ([]TopicBacklog, error)

	// DeploymentID is the ID of this database's outbox deployment.
	DeploymentID(ctx context.Context) (uuid.UUID, error)
	// RecordTaskQueue records taskQueue as the deployment's, unless another is recorded
	// already; it returns the deployment ID and the task queue recorded.
	RecordTaskQueue(ctx context.Context, taskQueue string) (id uuid.UUID, recorded string, err error)
	// PublishPolicy records p as the delivery policy in effect unless the recorded one is
	// newer (see PublishedPolicy for which wins), and returns the one in effect after the
	// call.
	PublishPolicy(ctx context.Context, p PublishedPolicy) (PublishedPolicy, error)
	// PublishedPolicy returns the delivery policy in effect: the zero PublishedPolicy when
	// none was published.
	PublishedPolicy(ctx context.Context) (PublishedPolicy, error)
}

// Answerer is implemented by a store that can tell the database's answer (an error the
// server returned: a permission refused, a table missing) from no answer (a connection
// refused or broken, a timeout), which waiting may cure. A process that waits for the
// database at start (the worker's deployment check) waits only for the second. A store
// without it has its errors taken as no answer, but for ErrNotMigrated.
type Answerer interface {
	Answered(err error) bool
}

// Operations is what an operator's commands need: inspect messages and dead letters,
// redrive or discard them (with an audit row each), read statistics and purge.
type Operations interface {
	Schema() string
	Get(ctx context.Context, messageID uuid.UUID) (Row, error)
	Stats(ctx context.Context) (Stats, error)
	ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetterRecord, error)
	DeadLetters(ctx context.Context, messageID uuid.UUID) ([]DeadLetterRecord, error)
	Audit(ctx context.Context, messageID uuid.UUID) ([]AuditEntry, error)
	Redrive(ctx context.Context, messageID uuid.UUID, actor string) (Redriven, error)
	Discard(ctx context.Context, messageID uuid.UUID, actor string) error
	// RedriveDeadLetter and DiscardDeadLetter act as Redrive and Discard only while
	// deadLetterID is the message's one open dead letter (the one an operator chose
	// from a list); otherwise they change nothing and return a *DeadLetterChangedError.
	RedriveDeadLetter(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) (Redriven, error)
	DiscardDeadLetter(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) error
	Purge(ctx context.Context, opts PurgeOptions) (PurgeResult, error)
	Deployment(ctx context.Context) (id uuid.UUID, taskQueue string, err error)
	MoveTaskQueue(ctx context.Context, taskQueue string) error

	// PauseTopic pauses topic until ResumeTopic: the relays hand none of its messages
	// over (a claim parks them, as it parks a keyed row held back behind its key), and
	// the send of a message handed over before waits without using an attempt. It
	// returns the topic's pause and whether this call made it (false: the topic was
	// paused already, and the earlier pause is returned unchanged).
	PauseTopic(ctx context.Context, topic, actor, reason string) (p TopicPause, paused bool, err error)
	// ResumeTopic ends topic's pause and puts its parked rows back on the claim's path;
	// it returns the pause it ended and whether there was one.
	ResumeTopic(ctx context.Context, topic string) (p TopicPause, resumed bool, err error)
	// PausedTopics lists the paused topics, by topic.
	PausedTopics(ctx context.Context) ([]TopicPause, error)
}

// Driver is one database's whole outbox store: the delivery machinery, the operators'
// commands, and the migrations that create its tables.
type Driver interface {
	Delivery
	Operations
	// Migrate applies the migrations not yet applied and returns their versions.
	Migrate(ctx context.Context) ([]int, error)
}

// Notifier is implemented by a store whose database tells the relays when rows commit
// (PostgreSQL's LISTEN/NOTIFY). A relay on a store without it polls.
type Notifier interface {
	// Channel is the notification channel.
	Channel() string
	// NotifyEnabled reports whether the table's insert trigger sends notifications.
	NotifyEnabled(ctx context.Context) (bool, error)
}
