package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Column lists the archive copies. The archive tables have these columns plus
// archived_at; a migration that adds a column to a table adds it to its archive table and
// here (a test compares archived rows with the originals column by column).
var (
	messageColumns = []string{"id", "message_id", "topic", "payload", "headers", "status", "retry_times",
		"max_retry_times", "next_retry_at", "ordering_key", "ordering_seq", "lease_until", "claim_token",
		"last_error", "redrive_count", "dispatched_at", "sent_at", "created_at", "updated_at", "held_back", "idempotency_key",
		"batch_id"}
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
// index (outbox_messages_finished_idx, outbox_dead_letters_discarded_idx), skipping rows
// other transactions hold; ages compare with the database clock ($1 is the age in
// seconds). A message's age counts from finishedAt: when it was sent, or for a discarded
// row (which has no sent_at) when it was discarded. The chosen rows are MATERIALIZED
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
	// nothing, %[8]s the status, %[9]s the expression the age counts from.
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

	// finishedAt is the expression of outbox_messages_finished_idx (migration 0015), verbatim
	// so that the planner uses the index. A row marked sent by hand without a sent_at counts
	// from its last update.
	finishedAt = "COALESCE(sent_at, updated_at)"

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
		sent:      fmt.Sprintf(purgeMessagesSQL, s.messages, s.dead, mret, dret, marchive, darchive, audit, StatusSent, finishedAt),
		discarded: fmt.Sprintf(purgeMessagesSQL, s.messages, s.dead, mret, dret, marchive, darchive, audit, StatusDiscarded, finishedAt),
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

// Purge runs PurgeBatch until a batch is not full, and returns the total. Each batch is
// its own short transaction, so a large backlog never holds locks for long. When ctx ends
// between batches it returns what was removed so far and ctx's error.
func (s *Store) Purge(ctx context.Context, opts PurgeOptions) (PurgeResult, error) {
	return PurgeAll(ctx, s.PurgeBatch, opts)
}
