package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

// ClaimStaleDispatched takes up to limit rows that have been dispatched, and not updated,
// for longer than age (by the database clock), least recently updated first, and touches
// them (updated_at = now), skipping rows another transaction holds, so concurrent relays
// take disjoint rows and a row is looked at again only after age has passed once more.
// The returned UpdatedAt is the touch, which Repair checks. It is one READ COMMITTED
// transaction: select FOR UPDATE SKIP LOCKED, update by id, read back.
func (s *Store) ClaimStaleDispatched(ctx context.Context, age time.Duration, limit int) ([]storedriver.Dispatched, error) {
	var out []storedriver.Dispatched
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		out = nil
		ids, err := queryIDs(ctx, tx, `SELECT id FROM `+s.messages+`
WHERE status = 'dispatched' AND updated_at < NOW(6) - INTERVAL ? MICROSECOND
ORDER BY updated_at
LIMIT ?
FOR UPDATE SKIP LOCKED`, micros(age), limit)
		if err != nil || len(ids) == 0 {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET updated_at = NOW(6) WHERE id IN (`+idList(ids)+`)`); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, message_id, topic, dispatched_at, updated_at, batch_id FROM `+s.messages+`
WHERE id IN (`+idList(ids)+`)`)
		if err != nil {
			return err
		}
		defer rows.Close()
		byID := make(map[int64]storedriver.Dispatched, len(ids))
		for rows.Next() {
			var d storedriver.Dispatched
			var dispatchedAt *time.Time
			if err := rows.Scan(&d.ID, &d.MessageID, &d.Topic, &dispatchedAt, &d.UpdatedAt, &d.BatchID); err != nil {
				return err
			}
			if dispatchedAt != nil {
				d.DispatchedAt = *dispatchedAt
			}
			byID[d.ID] = d
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			if d, ok := byID[id]; ok {
				out = append(out, d)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find stale dispatched messages: %w", err)
	}
	return out, nil
}

// stillDispatched is reconciliation's guard, with two parameters: the row is the one a
// Dispatched was read from (its id), still dispatched, and not updated since it was read
// (its updated_at).
const stillDispatched = "id = ? AND status = 'dispatched' AND updated_at = ?"

// Repair applies a reconciliation outcome to a dispatched row in one transaction, only if
// the row has not changed since it was read (same status and updated_at), and audits it
// with detail. ok is false when the row moved on meanwhile. storedriver.ReconcileRecordedSent
// moves the row to sent, storedriver.ReconcileHandedOverAgain back to pending.
func (s *Store) Repair(ctx context.Context, d storedriver.Dispatched, outcome storedriver.ReconcileOutcome, detail string) (ok bool, err error) {
	var move func(tx *sql.Tx) (bool, error)
	switch outcome {
	case storedriver.ReconcileRecordedSent:
		move = func(tx *sql.Tx) (bool, error) {
			sent, err := s.markSent(ctx, tx, []uuid.UUID{d.MessageID}, &d)
			return len(sent) > 0, err
		}
	case storedriver.ReconcileHandedOverAgain:
		move = func(tx *sql.Tx) (bool, error) { return s.handOverAgain(ctx, tx, d) }
	default:
		return false, fmt.Errorf("repair outcome must be %s or %s, got %q", storedriver.ReconcileRecordedSent, storedriver.ReconcileHandedOverAgain, outcome)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		ok = false
		moved, err := move(tx)
		if err != nil || !moved {
			return err
		}
		ok = true
		note := storedriver.StorableText(string(outcome) + ": " + detail)
		return s.writeAudit(ctx, tx, d.MessageID, nil, "reconcile", "relay", &note)
	})
	if err != nil {
		return false, fmt.Errorf("repair message %s: %w", d.MessageID, err)
	}
	return ok, nil
}

// handOverAgain is the one writer of dispatched → pending: reconciliation hands a row whose
// workflow is missing, or closed without delivering it, over again, in tx and only while
// the row is as d was read. dispatched_at stays: the next run knows an earlier one may have
// sent the message. ok is false when the row moved on.
func (s *Store) handOverAgain(ctx context.Context, tx *sql.Tx, d storedriver.Dispatched) (ok bool, err error) {
	res, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET status = 'pending', next_retry_at = NULL, updated_at = NOW(6)
WHERE `+stillDispatched, d.ID, d.UpdatedAt)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}
