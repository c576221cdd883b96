package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ClaimStaleDispatched takes up to limit rows that have been dispatched, and not updated,
// for longer than age (by the database clock), least recently updated first: the rows
// whose workflow reconciliation should look at. It touches them (updated_at = now()) in
// the same statement, skipping rows another transaction holds, so concurrent relays take
// disjoint rows and a row is looked at again only after age has passed once more. The
// returned UpdatedAt is the touch, which Repair checks.
func (s *Store) ClaimStaleDispatched(ctx context.Context, age time.Duration, limit int) ([]Dispatched, error) {
	rows, err := s.db.Query(ctx, `UPDATE `+s.messages+` AS m SET updated_at = now()
FROM (SELECT id FROM `+s.messages+`
      WHERE status = 'dispatched' AND updated_at < now() - make_interval(secs => $1)
      ORDER BY updated_at
      LIMIT $2
      FOR UPDATE SKIP LOCKED) AS stale
WHERE m.id = stale.id
RETURNING m.id, m.message_id, m.topic, m.dispatched_at, m.updated_at, m.batch_id`, age.Seconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("find stale dispatched messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Dispatched, error) {
		var d Dispatched
		var dispatchedAt *time.Time
		err := r.Scan(&d.ID, &d.MessageID, &d.Topic, &dispatchedAt, &d.UpdatedAt, &d.BatchID)
		if dispatchedAt != nil {
			d.DispatchedAt = *dispatchedAt
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("find stale dispatched messages: %w", err)
	}
	return out, nil
}

// Repair applies a reconciliation outcome to a dispatched row in one transaction, only if
// the row has not changed since it was read (same status and updated_at), and audits it
// with detail. ok is false when the row moved on meanwhile. ReconcileRecordedSent moves
// the row to sent (markSent), ReconcileHandedOverAgain back to pending (handOverAgain).
func (s *Store) Repair(ctx context.Context, d Dispatched, outcome ReconcileOutcome, detail string) (ok bool, err error) {
	var move func(tx pgx.Tx) (bool, error)
	switch outcome {
	case ReconcileRecordedSent:
		move = func(tx pgx.Tx) (bool, error) {
			sent, err := s.markSent(ctx, tx, []uuid.UUID{d.MessageID}, &d)
			return len(sent) > 0, err
		}
	case ReconcileHandedOverAgain:
		move = func(tx pgx.Tx) (bool, error) { return s.handOverAgain(ctx, tx, d) }
	default:
		return false, fmt.Errorf("repair outcome must be %s or %s, got %q", ReconcileRecordedSent, ReconcileHandedOverAgain, outcome)
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		moved, err := move(tx)
		if err != nil || !moved {
			return err
		}
		ok = true
		note := StorableText(string(outcome) + ": " + detail)
		return s.writeAudit(ctx, tx, d.MessageID, nil, "reconcile", "relay", &note)
	})
	if err != nil {
		return false, fmt.Errorf("repair message %s: %w", d.MessageID, err)
	}
	return ok, nil
}

// stillDispatched is reconciliation's guard, with its parameters from $p: the row is the
// one a Dispatched was read from ($p its id), still dispatched, and not updated since it
// was read ($p+1 its updated_at).
func stillDispatched(p int) string {
	return fmt.Sprintf("id = $%d AND status = 'dispatched' AND updated_at = $%d", p, p+1)
}

// handOverAgain is the one writer of dispatched → pending: reconciliation hands a row
// whose workflow is missing, or closed without delivering it, over again, in the caller's
// transaction tx and only while the row is as d was read (stillDispatched). It wakes the
// relays when tx commits. dispatched_at stays: the next run knows an earlier one may have
// sent the message. ok is false when the row moved on.
func (s *Store) handOverAgain(ctx context.Context, tx pgx.Tx, d Dispatched) (ok bool, err error) {
	tag, err := tx.Exec(ctx, `UPDATE `+s.messages+` SET status = 'pending', next_retry_at = NULL, updated_at = now()
WHERE `+stillDispatched(1), d.ID, d.UpdatedAt)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	return true, s.wake(ctx, tx)
}
