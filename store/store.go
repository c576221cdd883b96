// Package store owns the outbox tables in PostgreSQL: the schema and its migrations,
// [Store.Enqueue] (the one INSERT a business transaction makes), the relay's claim, and
// every status transition of a message.
//
// # Statuses
//
// A message row moves through these statuses. Each change has one writer, a guarded
// UPDATE that names the statuses it may leave from, which every caller goes through:
//
//	pending ──claim──▶ claimed ──handed over──▶ dispatched ──▶ sent
//	   ▲                  │ (lease ends: claimable again)  └──▶ dead ──▶ discarded
//	   └──────────────────┘
//
// plus dead → pending (a redrive) and dispatched → pending (reconciliation hands the row
// over again). The writers, and the entry points that call them:
//
//	pending, claimed (lease ended) → claimed   ClaimBatch (Claim, ClaimOrdered)
//	claimed → dispatched                       MarkDispatchedAll (MarkDispatched)
//	pending, claimed, dispatched → sent        markSent (RecordSent, MarkSent, Repair)
//	pending, claimed, dispatched → dead        DeadLetter
//	dispatched → pending                       handOverAgain (Repair)
//	dead → pending                             Redrive
//	dead → discarded                           Discard
//
// A row reaches sent and dead from pending and claimed too: a workflow may finish before
// the relay records its start.
//
// An UPDATE that matches no row means another actor got there first (a second relay, a
// workflow that finished before the relay recorded its start). That is reported as
// ok == false, not as an error, and a late transition can never move a row back from
// sent.
package store

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
)

// DB is what the functions of this package need to run queries: a *pgxpool.Pool, a
// *pgx.Conn and a pgx.Tx all satisfy it, so [Store.Enqueue] joins the caller's transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TxDB is a DB that can also begin a transaction; *pgxpool.Pool and *pgx.Conn satisfy it.
type TxDB interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Enqueuer is what business code needs of a Store: enqueue messages in its own
// transaction, given as db (a pgx.Tx, or store.SQLTx of a *sql.Tx). *Store implements it;
// code that takes an Enqueuer instead sees nothing of the delivery machinery or the
// operators' methods, and its tests may pass a recording fake.
type Enqueuer interface {
	Enqueue(ctx context.Context, db DB, msg Message) (uuid.UUID, error)
	EnqueueMessage(ctx context.Context, db DB, msg Message) (Enqueued, error)
	EnqueueJSON(ctx context.Context, db DB, msg Message, v any) (Enqueued, error)
	EnqueueBatch(ctx context.Context, db DB, msgs []Message) ([]Enqueued, error)
}

var _ Enqueuer = (*Store)(nil)

// Config configures a Store.
type Config struct {
	// Schema holds the outbox tables. Defaults to "public".
	Schema string
	// MaxPayloadBytes limits the size of a message payload. Defaults to
	// DefaultMaxPayloadBytes (256 KiB); at most HardMaxPayloadBytes.
	MaxPayloadBytes int
	// Propagator writes the trace context of the enqueuing span into a message's headers.
	// Defaults to the global propagator (otel.GetTextMapPropagator), falling back to W3C
	// traceparent and tracestate when that writes no traceparent.
	Propagator propagation.TextMapPropagator
}

var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

func (c Config) withDefaults() Config {
	c.Schema = cmp.Or(c.Schema, "public")
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	return c
}

func (c Config) validate() error {
	if !schemaPattern.MatchString(c.Schema) {
		return fmt.Errorf("schema must match %s, got %q", schemaPattern, c.Schema)
	}
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > HardMaxPayloadBytes {
		return fmt.Errorf("max payload bytes must be between 1 and %d, got %d", HardMaxPayloadBytes, c.MaxPayloadBytes)
	}
	return nil
}

// Store runs the outbox's queries against one schema. It is safe for concurrent use.
type Store struct {
	cfg      Config
	db       TxDB
	messages string // quoted, schema-qualified table names
	dead     string
	audit    string
	pauses   string

	selectRows string // SELECT of Get and GetAll, up to the WHERE

	// The INSERTs of Enqueue: a message with neither ordering nor idempotency key, with an
	// ordering key, with an idempotency key; and of EnqueueBatch, without and with keys.
	enqueuePlain, enqueue, enqueueIdempotent string
	enqueueBatch, enqueueBatchIdempotent     string

	messagesArchive, deadArchive string // where retention moves rows when archiving

	deployment   string                    // the deployment table
	deploymentID atomic.Pointer[uuid.UUID] // read once by DeploymentID
}

// New returns a Store that runs its own queries on db (usually a *pgxpool.Pool).
// Enqueue runs on whatever DB it is given instead, so that it joins the caller's
// transaction.
func New(db TxDB, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("store config: %w", err)
	}
	messages := pgx.Identifier{cfg.Schema, "outbox_messages"}.Sanitize()
	pauses := pgx.Identifier{cfg.Schema, "outbox_topic_pauses"}.Sanitize()
	return &Store{
		cfg:      cfg,
		db:       db,
		messages: messages,
		dead:     pgx.Identifier{cfg.Schema, "outbox_dead_letters"}.Sanitize(),
		audit:    pgx.Identifier{cfg.Schema, "outbox_audit"}.Sanitize(),
		pauses:   pauses,

		selectRows: fmt.Sprintf(selectRowsSQL, messages, pauses),

		enqueuePlain:           fmt.Sprintf(enqueuePlainSQL, messages),
		enqueue:                fmt.Sprintf(enqueueSQL, messages),
		enqueueIdempotent:      fmt.Sprintf(enqueueIdempotentSQL, messages),
		enqueueBatch:           fmt.Sprintf(enqueueBatchSQL, messages),
		enqueueBatchIdempotent: fmt.Sprintf(enqueueBatchIdempotentSQL, messages),

		messagesArchive: pgx.Identifier{cfg.Schema, "outbox_messages_archive"}.Sanitize(),
		deadArchive:     pgx.Identifier{cfg.Schema, "outbox_dead_letters_archive"}.Sanitize(),
		deployment:      pgx.Identifier{cfg.Schema, "outbox_deployment"}.Sanitize(),
	}, nil
}

// Schema returns the schema that holds the outbox tables.
func (s *Store) Schema() string { return s.cfg.Schema }

// Channel returns the name of the channel the insert trigger notifies.
func (s *Store) Channel() string { return Channel(s.cfg.Schema) }

// Channel returns the NOTIFY channel of the outbox tables in schema.
func Channel(schema string) string { return schema + ".outbox_messages" }

// DB returns the database the Store runs its own queries on.
func (s *Store) DB() TxDB { return s.db }

// inTx runs fn in a transaction on the store's database. The rollback after a failure
// runs even when ctx has been cancelled.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
