package store

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultPurgeLimit is the number of rows one purge batch removes when
// PurgeOptions.Limit is zero; MaxPurgeLimit is the most it may remove.
const (
	DefaultPurgeLimit = 1000
	MaxPurgeLimit     = 100000
)

// MinRetentionAge is the shortest SentAfter and DiscardedAfter: a shorter one would remove
// rows that a relay, a worker or an operator may still be looking at.
const MinRetentionAge = time.Minute

// PurgeOptions says which rows retention removes and how.
type PurgeOptions struct {
	// SentAfter is the age (since sent_at, by the database clock) after which sent
	// messages are removed. Required: at least MinRetentionAge.
	SentAfter time.Duration
	// DiscardedAfter is the age (since the message was discarded, by the database clock)
	// after which discarded messages and their dead letters are removed, as are dead
	// letters discarded that long ago whose message row no longer exists. Required: at
	// least MinRetentionAge.
	DiscardedAfter time.Duration
	// Archive moves the rows to outbox_messages_archive and outbox_dead_letters_archive
	// instead of deleting them.
	Archive bool
	// Limit caps the messages (and orphaned dead letters) one batch removes. Defaults to
	// DefaultPurgeLimit (1000).
	Limit int
}

// WithDefaults returns o with a zero Limit set to DefaultPurgeLimit.
func (o PurgeOptions) WithDefaults() PurgeOptions {
	o.Limit = cmp.Or(o.Limit, DefaultPurgeLimit)
	return o
}

// Validate reports the first field of o (after WithDefaults) that is out of range.
func (o PurgeOptions) Validate() error {
	switch {
	case o.SentAfter < MinRetentionAge:
		return fmt.Errorf("retention: sent_after must be at least %s, got %s", MinRetentionAge, o.SentAfter)
	case o.DiscardedAfter < MinRetentionAge:
		return fmt.Errorf("retention: discarded_after must be at least %s, got %s", MinRetentionAge, o.DiscardedAfter)
	case o.Limit < 1 || o.Limit > MaxPurgeLimit:
		return fmt.Errorf("retention: limit must be between 1 and %d, got %d", MaxPurgeLimit, o.Limit)
	}
	return nil
}

// PurgeResult counts the rows a purge removed (deleted, or moved to the archive tables).
type PurgeResult struct {
	// SentMessages is the number of sent messages removed.
	SentMessages int64
	// DiscardedMessages is the number of discarded messages removed.
	DiscardedMessages int64
	// DeadLetters is the number of dead letters removed: those of the removed messages
	// (a sent message keeps the dead letters of its runs before a redrive) and discarded
	// ones whose message row was already gone.
	DeadLetters int64
	// Batches is the number of batches (transactions) run.
	Batches int
	// More reports that the last batch removed as many rows as its limit, so more may be
	// due. Purge runs batches until it is false.
	More bool
}

// Add adds the counts of r to p.
func (p *PurgeResult) Add(r PurgeResult) {
	p.SentMessages += r.SentMessages
	p.DiscardedMessages += r.DiscardedMessages
	p.DeadLetters += r.DeadLetters
	p.Batches += r.Batches
	p.More = r.More
}

// Column lists the archive copies. The archive tables have these columns plus
// archived_at; a migration that adds a column to a table adds it to its archive table and
// here (a test compares archived rows with the originals column by column).
var (
	messageColumns = []string{"id", "message_id", "topic", "payload", "headers", "status", "retry_times",
		"max_retry_times", "next_retry_at", "ordering_key", "ordering_seq", "lease_until", "claim_token",
		"last_error", "redrive_count", "dispatched_at", "sent_at", "created_at", "updated_at", "held_back", "idempotency_key"}
	deadLetterArchiveColumns = []string{"id", "message_id", "workflow_id", "run_id", "topic", "payload", "headers",
		"attempts", "last_error", "message_created_at", "dead_lettered_at", "redriven_at", "discarded_at",
		"redriven_by", "discarded_by"}
)

// columns returns cols joined by commas, each prefixed with alias and a dot when alias is
// not empty.
func columns(alias string, cols []string) string {
	if alias == "" {
		return strings.Join(cols, ", ")
	}
	return alias + "." + strings.Join(cols, ", "+alias+".")
}

// The purge statements. Each chooses at most $2 rows, oldest first, through a retention
// index (outbox_messages_sent_at_idx, outbox_messages_discarded_idx,
// outbox_dead_letters_discarded_idx), skipping rows other transactions hold; ages compare
// with the database clock ($1 is the age in seconds). The chosen rows are MATERIALIZED
// before the DELETE: a LIMIT ... FOR UPDATE SKIP LOCKED subquery that the planner rescans
// would skip the rows the statement has already deleted and choose new ones each time. The
// DELETEs repeat the status condition, so only sent or discarded messages are ever removed.
// Each statement returns the number of rows it removed; when archiving, the CTEs
// archived_messages and archived_dead_letters insert the removed rows into the archive
// tables in the same statement.
//
// A removed message takes its dead letters with it (a sent message may have some from
// before a redrive), and, when deleting, its audit entries.
const (
	// Sent or discarded messages: %[1]s messages, %[2]s dead letters, %[3]s and %[4]s the
	// RETURNING lists, %[5]s and %[6]s the archive CTEs or nothing, %[7]s the audit CTE or
	// nothing, %[8]s the status, %[9]s the column the age counts from.
	purgeMessagesSQL = `WITH victims AS MATERIALIZED (
  SELECT id FROM %[1]s
  WHERE status = '%[8]s' AND %[9]s < now() - make_interval(secs => $1)
  ORDER BY %[9]s
  LIMIT $2
  FOR UPDATE SKIP LOCKED),
msgs AS (
  DELETE FROM %[1]s m USING victims v
  WHERE m.id = v.id AND m.status = '%[8]s'
  RETURNING %[3]s),
dls AS (
  DELETE FROM %[2]s d USING msgs
  WHERE d.message_id = msgs.message_id
  RETURNING %[4]s)%[5]s%[6]s%[7]s
SELECT (SELECT count(*) FROM msgs), (SELECT count(*) FROM dls)`

	// %[1]s messages, %[2]s dead letters, %[3]s the RETURNING list, %[4]s the archive CTE
	// or nothing.
	purgeOrphansSQL = `WITH victims AS MATERIALIZED (
  SELECT d.id FROM %[2]s d
  WHERE d.discarded_at < now() - make_interval(secs => $1)
    AND NOT EXISTS (SELECT 1 FROM %[1]s m WHERE m.message_id = d.message_id)
  ORDER BY d.discarded_at
  LIMIT $2
  FOR UPDATE OF d SKIP LOCKED),
dls AS (
  DELETE FROM %[2]s d USING victims v
  WHERE d.id = v.id
  RETURNING %[3]s)%[4]s
SELECT count(*) FROM dls`

	archiveCTE = ",\n%s AS (INSERT INTO %s (%s) SELECT %[3]s FROM %s)"
	auditCTE   = ",\naudit AS (DELETE FROM %s a USING msgs WHERE a.message_id = msgs.message_id)"
)

// purgeSQL holds the statements of one store and mode.
type purgeSQL struct{ sent, discarded, orphans string }

func (s *Store) purgeSQL(archive bool) purgeSQL {
	mret, dret := "m.message_id", "d.id"
	var marchive, darchive string
	audit := fmt.Sprintf(auditCTE, s.audit) // archiving keeps the audit beside the archive
	if archive {
		mret, dret = columns("m", messageColumns), columns("d", deadLetterArchiveColumns)
		marchive = fmt.Sprintf(archiveCTE, "archived_messages", s.messagesArchive, columns("", messageColumns), "msgs")
		darchive = fmt.Sprintf(archiveCTE, "archived_dead_letters", s.deadArchive, columns("", deadLetterArchiveColumns), "dls")
		audit = ""
	}
	return purgeSQL{
		sent:      fmt.Sprintf(purgeMessagesSQL, s.messages, s.dead, mret, dret, marchive, darchive, audit, StatusSent, "sent_at"),
		discarded: fmt.Sprintf(purgeMessagesSQL, s.messages, s.dead, mret, dret, marchive, darchive, audit, StatusDiscarded, "updated_at"),
		orphans:   fmt.Sprintf(purgeOrphansSQL, s.messages, s.dead, dret, darchive),
	}
}

// PurgeBatch removes one batch of old rows in one short transaction: sent messages older
// than opts.SentAfter; discarded messages older than opts.DiscardedAfter together with all
// their dead letters; and dead letters discarded longer than opts.DiscardedAfter ago whose
// message row no longer exists. It removes at most opts.Limit of these messages and
// orphaned dead letters together (sent messages first), oldest first, skipping rows that
// other transactions hold; the dead letters of the discarded messages come on top. With
// opts.Archive the rows are moved to the archive tables in the same statements.
//
// Rows in any other status (pending, claimed, dispatched, dead) are never touched. The
// result's More is true when the batch was full, so another batch may find more.
func (s *Store) PurgeBatch(ctx context.Context, opts PurgeOptions) (PurgeResult, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return PurgeResult{}, err
	}
	q := s.purgeSQL(opts.Archive)
	var (
		res  PurgeResult
		left int64 // messages and orphaned dead letters this batch may still remove
	)
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		res, left = PurgeResult{Batches: 1}, int64(opts.Limit)
		var sentDead int64
		if err := tx.QueryRow(ctx, q.sent, opts.SentAfter.Seconds(), left).Scan(&res.SentMessages, &sentDead); err != nil {
			return fmt.Errorf("sent messages: %w", err)
		}
		res.DeadLetters += sentDead
		if left -= res.SentMessages; left <= 0 {
			return nil
		}
		var discardedDead int64
		if err := tx.QueryRow(ctx, q.discarded, opts.DiscardedAfter.Seconds(), left).Scan(&res.DiscardedMessages, &discardedDead); err != nil {
			return fmt.Errorf("discarded messages: %w", err)
		}
		res.DeadLetters += discardedDead
		if left -= res.DiscardedMessages; left <= 0 {
			return nil
		}
		var orphans int64
		if err := tx.QueryRow(ctx, q.orphans, opts.DiscardedAfter.Seconds(), left).Scan(&orphans); err != nil {
			return fmt.Errorf("discarded dead letters: %w", err)
		}
		res.DeadLetters += orphans
		left -= orphans
		return nil
	})
	if err != nil {
		return PurgeResult{}, PurgeError(opts, err)
	}
	res.More = left <= 0
	return res, nil
}

// PurgeError is a failure of a purge with opts, as every store reports it.
func PurgeError(opts PurgeOptions, err error) error {
	verb := "delete"
	if opts.Archive {
		verb = "archive"
	}
	return fmt.Errorf("retention: %s old rows: %w", verb, err)
}

// Purge runs PurgeBatch until a batch is not full, and returns the total. Each batch is
// its own short transaction, so a large backlog never holds locks for long. When ctx ends
// between batches it returns what was removed so far and ctx's error.
func (s *Store) Purge(ctx context.Context, opts PurgeOptions) (PurgeResult, error) {
	return PurgeAll(ctx, s.PurgeBatch, opts)
}

// PurgeAll is a store's Purge: it runs batch until a batch is not full and returns the
// total, or, when ctx ends between batches, what was removed so far and ctx's error.
func PurgeAll(ctx context.Context, batch func(context.Context, PurgeOptions) (PurgeResult, error), opts PurgeOptions) (PurgeResult, error) {
	var total PurgeResult
	for {
		if err := ctx.Err(); err != nil {
			return total, PurgeError(opts, err)
		}
		res, err := batch(ctx, opts)
		if err != nil {
			return total, err
		}
		total.Add(res)
		if !res.More {
			return total, nil
		}
	}
}
