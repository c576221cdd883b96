package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

// The columns the archive copies: package store's lists (the archive tables have these
// columns plus archived_at; claim_lane is not copied, it is derived).
var (
	messageColumns = []string{"id", "message_id", "topic", "payload", "headers", "status", "retry_times",
		"max_retry_times", "next_retry_at", "ordering_key", "ordering_seq", "lease_until", "claim_token",
		"last_error", "redrive_count", "dispatched_at", "sent_at", "created_at", "updated_at", "held_back", "idempotency_key",
		"batch_id"}
	deadLetterArchiveColumns = []string{"id", "message_id", "workflow_id", "run_id", "topic", "payload", "headers",
		"attempts", "last_error", "message_created_at", "dead_lettered_at", "redriven_at", "discarded_at",
		"redriven_by", "discarded_by"}
)

// PurgeBatch removes one batch of old rows in one short READ COMMITTED transaction, as
// package store does: sent messages older than opts.SentAfter; discarded messages older
// than opts.DiscardedAfter together with all their dead letters; and dead letters
// discarded longer than opts.DiscardedAfter ago whose message row no longer exists. It
// removes at most opts.Limit of these messages and orphaned dead letters together (sent
// messages first), oldest first, skipping rows that other transactions hold; the dead
// letters of the removed messages come on top, and, when deleting, their audit entries.
// With opts.Archive the rows are copied to the archive tables in the same transaction
// and the audit is kept.
//
// Each group is chosen with a SELECT ... FOR UPDATE SKIP LOCKED through a retention index
// and then copied and deleted by id (MySQL has no data-modifying CTEs). Rows in any other
// status are never touched.
func (s *Store) PurgeBatch(ctx context.Context, opts storedriver.PurgeOptions) (storedriver.PurgeResult, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return storedriver.PurgeResult{}, err
	}
	var (
		res  storedriver.PurgeResult
		left int64
	)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, left = storedriver.PurgeResult{Batches: 1}, int64(opts.Limit)
		n, dead, err := s.purgeMessages(ctx, tx, storedriver.StatusSent, opts.SentAfter, left, opts.Archive)
		if err != nil {
			return fmt.Errorf("sent messages: %w", err)
		}
		res.SentMessages, res.DeadLetters = n, res.DeadLetters+dead
		if left -= n; left <= 0 {
			return nil
		}
		n, dead, err = s.purgeMessages(ctx, tx, storedriver.StatusDiscarded, opts.DiscardedAfter, left, opts.Archive)
		if err != nil {
			return fmt.Errorf("discarded messages: %w", err)
		}
		res.DiscardedMessages, res.DeadLetters = n, res.DeadLetters+dead
		if left -= n; left <= 0 {
			return nil
		}
		orphans, err := s.purgeOrphans(ctx, tx, opts.DiscardedAfter, left, opts.Archive)
		if err != nil {
			return fmt.Errorf("discarded dead letters: %w", err)
		}
		res.DeadLetters += orphans
		left -= orphans
		return nil
	})
	if err != nil {
		return storedriver.PurgeResult{}, storedriver.PurgeError(opts, err)
	}
	res.More = left <= 0
	return res, nil
}

// purgeMessages removes up to limit messages in status last changed longer than age ago
// (updated_at; a sent message's sent_at too, when it has one: a row marked sent by hand
// may not), with their dead letters, and returns how many messages and dead letters it
// removed. It reads outbox_messages_updated_idx: a sent row's updated_at is its sent_at,
// set by the same statement and not changed after, so sent rows need no index of their
// own, which every insert would pay for (InnoDB has no partial indexes).
func (s *Store) purgeMessages(ctx context.Context, tx *sql.Tx, status storedriver.Status, age time.Duration, limit int64, archive bool) (msgs, dead int64, err error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, message_id FROM `+s.messages+`
WHERE status = ? AND updated_at < NOW(6) - INTERVAL ? MICROSECOND
  AND (status <> 'sent' OR COALESCE(sent_at, updated_at) < NOW(6) - INTERVAL ? MICROSECOND)
ORDER BY updated_at
LIMIT ?
FOR UPDATE SKIP LOCKED`, string(status), micros(age), micros(age), limit)
	if err != nil {
		return 0, 0, err
	}
	var ids []int64
	var mids []uuid.UUID
	for rows.Next() {
		var id int64
		var mid uuid.UUID
		if err := rows.Scan(&id, &mid); err != nil {
			rows.Close()
			return 0, 0, err
		}
		ids, mids = append(ids, id), append(mids, mid)
	}
	if err := rows.Close(); err != nil {
		return 0, 0, err
	}
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, 0, err
	}
	deadIDs, err := queryIDs(ctx, tx, `SELECT id FROM `+s.dead+` WHERE message_id IN (`+uuidList(mids)+`) FOR UPDATE`)
	if err != nil {
		return 0, 0, err
	}
	if archive {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.messagesArchive+` (`+strings.Join(messageColumns, ", ")+`)
SELECT `+strings.Join(messageColumns, ", ")+` FROM `+s.messages+` WHERE id IN (`+idList(ids)+`) AND status = ?`, string(status)); err != nil {
			return 0, 0, err
		}
		if err := s.archiveDeadLetters(ctx, tx, deadIDs); err != nil {
			return 0, 0, err
		}
	} else {
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+s.audit+` WHERE message_id IN (`+uuidList(mids)+`)`); err != nil {
			return 0, 0, err
		}
	}
	if len(deadIDs) > 0 {
		r, err := tx.ExecContext(ctx, `DELETE FROM `+s.dead+` WHERE id IN (`+idList(deadIDs)+`)`)
		if err != nil {
			return 0, 0, err
		}
		if dead, err = r.RowsAffected(); err != nil {
			return 0, 0, err
		}
	}
	r, err := tx.ExecContext(ctx, `DELETE FROM `+s.messages+` WHERE id IN (`+idList(ids)+`) AND status = ?`, string(status))
	if err != nil {
		return 0, 0, err
	}
	msgs, err = r.RowsAffected()
	return msgs, dead, err
}

// archiveDeadLetters copies the dead letters ids to the archive table.
func (s *Store) archiveDeadLetters(ctx context.Context, tx *sql.Tx, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO `+s.deadArchive+` (`+strings.Join(deadLetterArchiveColumns, ", ")+`)
SELECT `+strings.Join(deadLetterArchiveColumns, ", ")+` FROM `+s.dead+` WHERE id IN (`+idList(ids)+`)`)
	return err
}

// purgeOrphans removes up to limit dead letters discarded longer than age ago whose message
// row no longer exists. The candidates are found with a consistent read, then locked
// (SKIP LOCKED) and checked again, so that a lock never depends on the subquery.
func (s *Store) purgeOrphans(ctx context.Context, tx *sql.Tx, age time.Duration, limit int64, archive bool) (int64, error) {
	orphans := `SELECT d.id FROM ` + s.dead + ` d
WHERE %s AND NOT EXISTS (SELECT 1 FROM ` + s.messages + ` m WHERE m.message_id = d.message_id)`
	candidates, err := queryIDs(ctx, tx, fmt.Sprintf(orphans, `d.discarded_at < NOW(6) - INTERVAL ? MICROSECOND`)+`
ORDER BY d.discarded_at
LIMIT ?`, micros(age), limit)
	if err != nil || len(candidates) == 0 {
		return 0, err
	}
	locked, err := queryIDs(ctx, tx, `SELECT id FROM `+s.dead+` WHERE id IN (`+idList(candidates)+`) FOR UPDATE SKIP LOCKED`)
	if err != nil || len(locked) == 0 {
		return 0, err
	}
	ids, err := queryIDs(ctx, tx, fmt.Sprintf(orphans, `d.id IN (`+idList(locked)+`)`))
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	if archive {
		if err := s.archiveDeadLetters(ctx, tx, ids); err != nil {
			return 0, err
		}
	}
	r, err := tx.ExecContext(ctx, `DELETE FROM `+s.dead+` WHERE id IN (`+idList(ids)+`)`)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// Purge runs PurgeBatch until a batch is not full, and returns the total. Each batch is
// its own short transaction. When ctx ends between batches it returns what was removed so
// far and ctx's error.
func (s *Store) Purge(ctx context.Context, opts storedriver.PurgeOptions) (storedriver.PurgeResult, error) {
	return storedriver.PurgeAll(ctx, s.PurgeBatch, opts)
}
