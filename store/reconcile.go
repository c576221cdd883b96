package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Dispatched is a row a workflow owns.
type Dispatched struct {
	ID           int64
	MessageID    uuid.UUID
	Topic        string
	DispatchedAt time.Time
	UpdatedAt    time.Time
}

// StaleDispatched returns up to limit rows that have been dispatched, and not updated, for
// longer than age (by the database clock), least recently updated first: the rows whose
// workflow reconciliation should look at.
func (s *Store) StaleDispatched(ctx context.Context, age time.Duration, limit int) ([]Dispatched, error) {
	rows, err := s.db.Query(ctx, `SELECT id, message_id, topic, dispatched_at, updated_at FROM `+s.messages+`
WHERE status = 'dispatched' AND updated_at < now() - make_interval(secs => $1)
ORDER BY updated_at
LIMIT $2`, age.Seconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("find stale dispatched messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Dispatched, error) {
		var d Dispatched
		return d, r.Scan(&d.ID, &d.MessageID, &d.Topic, &d.DispatchedAt, &d.UpdatedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("find stale dispatched messages: %w", err)
	}
	return out, nil
}

// Reconcile outcomes.
const (
	// ReconcileRunning: the workflow is still running; the row is left as it is.
	ReconcileRunning = "running"
	// ReconcileRecordedSent: the workflow completed but the row was not recorded sent.
	ReconcileRecordedSent = "recorded_sent"
	// ReconcileHandedOverAgain: the workflow is missing or closed without delivering; the
	// row is pending again and a relay starts a new run.
	ReconcileHandedOverAgain = "handed_over_again"
)

// TouchDispatched marks a dispatched row as checked, so the next reconciliation pass looks
// at others first. It changes nothing if the row moved on since seen.
func (s *Store) TouchDispatched(ctx context.Context, d Dispatched) (bool, error) {
	return s.exec(ctx, "touch dispatched message", `UPDATE `+s.messages+` SET updated_at = now()
WHERE id = $1 AND status = 'dispatched' AND updated_at = $2`, d.ID, d.UpdatedAt)
}

// Repair applies a reconciliation outcome to a dispatched row in one transaction, only if
// the row has not changed since it was read (same status and updated_at), and audits it
// with detail. ok is false when the row moved on meanwhile.
func (s *Store) Repair(ctx context.Context, d Dispatched, outcome, detail string) (ok bool, err error) {
	var set string
	switch outcome {
	case ReconcileRecordedSent:
		set = `status = 'sent', sent_at = now()`
	case ReconcileHandedOverAgain:
		// dispatched_at stays: the next run knows an earlier one may have sent it.
		set = `status = 'pending', next_retry_at = NULL`
	default:
		return false, fmt.Errorf("repair outcome must be %s or %s, got %q", ReconcileRecordedSent, ReconcileHandedOverAgain, outcome)
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE `+s.messages+` SET `+set+`, updated_at = now()
WHERE id = $1 AND status = 'dispatched' AND updated_at = $2`, d.ID, d.UpdatedAt)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		ok = true
		if outcome == ReconcileHandedOverAgain {
			if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, s.Channel()); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+s.audit+` (message_id, action, actor, detail) VALUES ($1, 'reconcile', 'relay', $2)`,
			d.MessageID, StorableText(outcome+": "+detail))
		return err
	})
	if err != nil {
		return false, fmt.Errorf("repair message %s: %w", d.MessageID, err)
	}
	return ok, nil
}
