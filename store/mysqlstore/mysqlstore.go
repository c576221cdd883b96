// Package mysqlstore is the outbox store on MySQL 8.0+ and MariaDB 10.6+: the same tables,
// statuses and guarded transitions as package store (the PostgreSQL store), behind the
// same interface, storedriver.Driver. The relay, the worker and the commands run on either.
//
// Business code calls [Store.Enqueue] (or [Store.EnqueueMessage], [Store.EnqueueBatch])
// with its own *sql.Tx, so the message commits or rolls back with the business rows:
//
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, 42); err != nil { ... }
//	if _, err := st.Enqueue(ctx, tx, mysqlstore.Message{Topic: "order.created", Payload: payload}); err != nil { ... }
//	err = tx.Commit()
//
// # Differences from PostgreSQL
//
// The statuses, the transitions and what each method reports are those of package store;
// what MySQL lacks is made up for as follows (migrations/0001_create_outbox.up.sql says
// the same about the tables):
//
//   - No NOTIFY: the relays poll.
//   - No partial indexes: a stored generated column, claim_lane, is 1 for a row due at once
//     and 2 for a delayed row (pending or claimed, not held back), NULL otherwise, and the
//     claim reads the index (claim_lane, next_retry_at, id), so sent and held-back rows are
//     not on its path.
//   - No RETURNING and no data-modifying CTEs: the claim is one READ COMMITTED transaction
//     that selects the due rows FOR UPDATE SKIP LOCKED, decides which are held back,
//     updates them by id and reads them back before it commits.
//   - No trigger may change the table it fires on: releasing a key's next parked row
//     when a keyed message is sent, dead-lettered or discarded is done by the Go method
//     that moves the row, in the same transaction. The per-key park lock is a row of
//     outbox_ordering_parks instead of an advisory lock.
//   - Ordering numbers come from a counter row per key (outbox_ordering_keys), taken by
//     the insert trigger with an upsert that keeps the row locked until the writer's
//     transaction ends: a key's numbers are in commit order, without gaps.
//   - An idempotency key already held makes the INSERT fail on the key's unique index,
//     which rolls back that statement alone: Enqueue reports the duplicate and the
//     caller's transaction goes on, as with PostgreSQL's ON CONFLICT DO NOTHING.
//   - InnoDB breaks a deadlock by rolling a whole transaction back; the store's own
//     transactions run again when that happens (up to five attempts). Enqueue runs in the
//     caller's transaction, so its deadlock error goes to the caller (see
//     ErrOrderingDeadlock).
//   - Times are TIMESTAMP(6) in UTC, read and written by the database clock (NOW(6));
//     TIMESTAMP ends in January 2038.
package mysqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"

	"github.com/outbox-go/outbox/store/storedriver"
)

// The message business code enqueues, what Enqueue reports, and the error an invalid
// message returns: package storedriver's types, which package store (PostgreSQL) names
// too, so business code on MySQL imports this package alone.
type (
	Message         = storedriver.Message
	Enqueued        = storedriver.Enqueued
	ValidationError = storedriver.ValidationError
)

// Kind is what [Store.Kind] returns.
const Kind = "mysql"

// DB is what Enqueue needs to run its statements: a *sql.DB, a *sql.Tx and a *sql.Conn all
// satisfy it, so Enqueue joins the caller's transaction.
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Enqueuer is what business code needs of a Store: enqueue messages in its own
// transaction, given as db (a *sql.Tx). *Store implements it; code that takes an Enqueuer
// instead sees nothing of the delivery machinery or the operators' methods, and its tests
// may pass a recording fake.
type Enqueuer interface {
	Enqueue(ctx context.Context, db DB, msg Message) (uuid.UUID, error)
	EnqueueMessage(ctx context.Context, db DB, msg Message) (Enqueued, error)
	EnqueueJSON(ctx context.Context, db DB, msg Message, v any) (Enqueued, error)
	EnqueueBatch(ctx context.Context, db DB, msgs []Message) ([]Enqueued, error)
}

var _ Enqueuer = (*Store)(nil)

// Config configures a Store.
type Config struct {
	// MaxPayloadBytes limits the size of a message payload. Defaults to
	// storedriver.DefaultMaxPayloadBytes (256 KiB); at most storedriver.HardMaxPayloadBytes.
	MaxPayloadBytes int
	// Propagator writes the trace context of the enqueuing span into a message's headers, as
	// store.Config.Propagator does (package store, PostgreSQL). Defaults to the global
	// propagator, falling back to W3C traceparent and tracestate when that writes no
	// traceparent.
	Propagator propagation.TextMapPropagator
}

func (c Config) withDefaults() Config {
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, storedriver.DefaultMaxPayloadBytes)
	return c
}

func (c Config) validate() error {
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > storedriver.HardMaxPayloadBytes {
		return fmt.Errorf("max payload bytes must be between 1 and %d, got %d", storedriver.HardMaxPayloadBytes, c.MaxPayloadBytes)
	}
	return nil
}

// Store runs the outbox's queries against the tables of one MySQL or MariaDB database. It
// is safe for concurrent use.
type Store struct {
	cfg    Config
	db     *sql.DB
	schema string // the database that holds the tables, as DATABASE() named it

	// Quoted, database-qualified table names.
	messages, dead, audit, orderingKeys, parks, pauses, deployment, migrations string
	messagesArchive, deadArchive                                               string

	deploymentID atomic.Pointer[uuid.UUID] // read once by DeploymentID

	// The MariaDB settings Enqueue's statements run with (see enqueueSettings).
	mariaDB, snapshotIsolation bool
}

// enqueueSettings returns the prefix of an enqueuing statement (the caller's session,
// whatever its settings) that runs it with the settings it needs, for a statement that
// numbers the messages of an ordering key (keyed) or sets a delivery time (delayed).
// Only MariaDB can set them for one statement (SET STATEMENT); elsewhere it is "".
//
//   - keyed: innodb_snapshot_isolation off (it is on by default from MariaDB 11.6.2).
//     With it on, a REPEATABLE READ transaction that has read anything fails with error
//     1020 ("Record has changed since last read") when it locks a row another
//     transaction changed since: an ordered enqueue takes its key's counter row, which
//     every writer of the key changes, and would fail whenever another one committed
//     meanwhile. The counter is a lock and a number, read as it stands, as PostgreSQL's
//     advisory lock and sequence are.
//   - delayed: time_zone UTC. FROM_UNIXTIME gives the session's local time, which the
//     TIMESTAMP column turns back into UTC: in a time zone with daylight saving time, the
//     hour the clocks go back happens twice, and a time in its second pass was stored an
//     hour early. In UTC every time is one instant.
func (s *Store) enqueueSettings(keyed, delayed bool) string {
	var set []string
	if keyed && s.snapshotIsolation {
		set = append(set, "innodb_snapshot_isolation = OFF")
	}
	if delayed && s.mariaDB {
		set = append(set, "time_zone = '+00:00'")
	}
	if len(set) == 0 {
		return ""
	}
	return "SET STATEMENT " + strings.Join(set, ", ") + " FOR "
}

var _ storedriver.Driver = (*Store)(nil)

// New returns a Store on db's current database (DATABASE()), which it reads once. db must
// read times as UTC: open it with [Open], or give its DSN parseTime=true, loc=UTC and
// time_zone='+00:00'; New checks this on one connection and says what is wrong. Enqueue
// runs on whatever DB it is given instead, which may use any session time zone.
func New(db *sql.DB, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("mysqlstore config: %w", err)
	}
	if db == nil {
		return nil, errors.New("mysqlstore: the database is nil: open one with mysqlstore.Open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema, version, err := checkConnection(ctx, db)
	if err != nil {
		return nil, err
	}
	q := func(table string) string { return quoteIdent(schema) + "." + quoteIdent(table) }
	snapshotIsolation, err := hasSnapshotIsolation(ctx, db)
	if err != nil {
		return nil, err
	}
	return &Store{
		mariaDB:           strings.Contains(strings.ToLower(version), "mariadb"),
		snapshotIsolation: snapshotIsolation,
		cfg:               cfg,
		db:                db,
		schema:            schema,
		messages:          q("outbox_messages"),
		dead:              q("outbox_dead_letters"),
		audit:             q("outbox_audit"),
		orderingKeys:      q("outbox_ordering_keys"),
		parks:             q("outbox_ordering_parks"),
		pauses:            q("outbox_topic_pauses"),
		deployment:        q("outbox_deployment"),
		migrations:        q("outbox_schema_migrations"),
		messagesArchive:   q("outbox_messages_archive"),
		deadArchive:       q("outbox_dead_letters_archive"),
	}, nil
}

// hasSnapshotIsolation reports whether db's server has the setting
// innodb_snapshot_isolation (MariaDB from 10.6.18 and 10.11.8).
func hasSnapshotIsolation(ctx context.Context, db *sql.DB) (bool, error) {
	rows, err := db.QueryContext(ctx, `SHOW VARIABLES LIKE 'innodb_snapshot_isolation'`)
	if err != nil {
		return false, fmt.Errorf("mysqlstore: read the server's settings: %w", err)
	}
	has := rows.Next()
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return false, fmt.Errorf("mysqlstore: read the server's settings: %w", err)
	}
	return has, nil
}

// checkConnection reads the connection's database and the server's version, and checks
// that times travel as UTC: the driver parses them (parseTime) in UTC (loc), and the
// session's time zone is UTC.
func checkConnection(ctx context.Context, db *sql.DB) (schemaName, version string, err error) {
	var (
		schema                     sql.NullString
		now                        time.Time
		tz, systemTZ               string
		offset                     int64
		fix                        = "open the database with mysqlstore.Open, or add parseTime=true&loc=UTC&time_zone=%27%2B00%3A00%27 to its DSN"
		timeZoneIsUTC, systemIsUTC bool
	)
	err = db.QueryRowContext(ctx, `SELECT DATABASE(), NOW(6), @@session.time_zone, @@system_time_zone,
  TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW()), VERSION()`).Scan(&schema, &now, &tz, &systemTZ, &offset, &version)
	if err != nil {
		if strings.Contains(err.Error(), "unsupported Scan") {
			return "", "", fmt.Errorf("mysqlstore: the driver does not parse times (parseTime is off): %s", fix)
		}
		return "", "", fmt.Errorf("mysqlstore: read the connection's database: %w", err)
	}
	if !schema.Valid || schema.String == "" {
		return "", "", errors.New("mysqlstore: the connection names no database: add /<database> to the URL")
	}
	if now.Location() != time.UTC && now.Location().String() != "UTC" {
		return "", "", fmt.Errorf("mysqlstore: the driver reads times in %s, not UTC (loc): %s", now.Location(), fix)
	}
	switch tz {
	case "+00:00", "-00:00", "+0:00", "UTC", "Etc/UTC", "Universal", "Zulu":
		timeZoneIsUTC = true
	case "SYSTEM":
		systemIsUTC = systemTZ == "UTC" || systemTZ == "Etc/UTC" || systemTZ == "Coordinated Universal Time"
	}
	if (!timeZoneIsUTC && !systemIsUTC) || offset != 0 {
		return "", "", fmt.Errorf("mysqlstore: the session time zone is %s (system %s), not UTC: %s", tz, systemTZ, fix)
	}
	return schema.String, version, nil
}

// quoteIdent quotes a MySQL identifier.
func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// Kind implements storedriver.Driver: "mysql", for MySQL and MariaDB alike.
func (s *Store) Kind() string { return Kind }

// Answered implements storedriver.Answerer: err is the server's answer (a
// *mysql.MySQLError), such as a permission refused.
func (s *Store) Answered(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me)
}

// Schema returns the database that holds the outbox tables.
func (s *Store) Schema() string { return s.schema }

// DB returns the database the Store runs its own queries on.
func (s *Store) DB() *sql.DB { return s.db }

// MaxPayloadBytes returns the payload size limit of this store: Config.MaxPayloadBytes, or
// storedriver.DefaultMaxPayloadBytes.
func (s *Store) MaxPayloadBytes() int { return s.cfg.MaxPayloadBytes }

// Validate checks msg against the store's limits, as package store does, and returns a
// *ValidationError naming the first field that is wrong. A MySQL JSON column also
// refuses numbers outside the range of a double, so the payload may not hold one, and
// MariaDB's refuses arrays and objects nested more than MaxPayloadDepth deep.
func (s *Store) Validate(msg Message) error {
	if err := storedriver.ValidateWith(msg, s.cfg.MaxPayloadBytes, doubleNumbers); err != nil {
		return err
	}
	if d := jsonDepth(msg.Payload); d > MaxPayloadDepth {
		return &storedriver.ValidationError{Field: "payload", Reason: fmt.Sprintf(
			"must nest arrays and objects at most %d deep (MariaDB's JSON limit; MySQL's is 100), got %d", MaxPayloadDepth, d)}
	}
	return nil
}

// MaxPayloadDepth is how deep a payload may nest arrays and objects: MariaDB's JSON_VALID
// (and so the column's CHECK) refuses 32 levels, MySQL 8 refuses 101.
const MaxPayloadDepth = 31

// jsonDepth returns how deep the JSON document p nests arrays and objects.
func jsonDepth(p []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range p {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString:
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// readCommitted is the isolation of the store's own transactions: no gap locks, and each
// statement sees what committed before it.
var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// deadlockRetries is how many times inTx runs a transaction that InnoDB chose as a
// deadlock's victim.
const deadlockRetries = 5

// deadlockRetried counts the transactions inTx ran again after a deadlock, for tests.
var deadlockRetried atomic.Int64

// inTx runs fn in a READ COMMITTED transaction on the store's database and commits it when
// fn returns nil. InnoDB breaks a deadlock by rolling one transaction back whole (error
// 1213), which MySQL's documentation asks the application to run again: inTx does, up to
// deadlockRetries times, so fn must start from scratch each time it is called. (A SKIP
// LOCKED scan of a secondary index keeps its lock on the index entry of a row it skipped,
// so two transactions that skip each other's rows and then change entries of that index
// can deadlock: two claims that both park rows, two reconciliations, two purges. The store
// locks by primary key where the order of a scan does not matter; see lockByID.)
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := s.tryTx(ctx, fn)
		if err == nil || attempt == deadlockRetries || !isErrNumber(err, errDeadlock) || ctx.Err() != nil {
			return err
		}
		deadlockRetried.Add(1)
		time.Sleep(time.Duration(rand.Int64N(int64(attempt) * int64(2*time.Millisecond))))
	}
}

func (s *Store) tryTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, readCommitted)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// exec runs a guarded UPDATE and reports whether it matched a row.
func (s *Store) exec(ctx context.Context, what, query string, args ...any) (bool, error) {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return n > 0, nil
}

// micros is d in whole microseconds, the precision of the TIMESTAMP(6) columns.
func micros(d time.Duration) int64 { return d.Microseconds() }
