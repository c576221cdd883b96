package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

const deadLetterColumns = `d.id, d.message_id, d.workflow_id, d.run_id, d.topic, d.payload, d.headers, d.attempts,
d.last_error, d.message_created_at, d.dead_lettered_at, d.redriven_at, d.redriven_by, d.discarded_at, d.discarded_by`

func scanDeadLetters(rows *sql.Rows) ([]storedriver.DeadLetterRecord, error) {
	defer rows.Close()
	var out []storedriver.DeadLetterRecord
	for rows.Next() {
		var d storedriver.DeadLetterRecord
		var payload, headers []byte
		if err := rows.Scan(&d.ID, &d.MessageID, &d.WorkflowID, &d.RunID, &d.Topic, &payload, &headers, &d.Attempts,
			&d.LastError, &d.MessageCreatedAt, &d.DeadLetteredAt, &d.RedrivenAt, &d.RedrivenBy, &d.DiscardedAt, &d.DiscardedBy); err != nil {
			return nil, err
		}
		d.Payload = payload
		if len(headers) > 0 {
			_ = json.Unmarshal(headers, &d.Headers) // as package store: headers of another shape are left out
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// ListDeadLetters returns dead letters matching f, newest first.
func (s *Store) ListDeadLetters(ctx context.Context, f storedriver.DeadLetterFilter) ([]storedriver.DeadLetterRecord, error) {
	if f.Limit == 0 {
		f.Limit = 100
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("limit must be positive, got %d", f.Limit)
	}
	where := []string{"TRUE"}
	var args []any
	if !f.IncludeClosed {
		where = append(where, "d.redriven_at IS NULL AND d.discarded_at IS NULL")
	}
	if f.Topic != "" {
		where = append(where, "d.topic = ?")
		args = append(args, f.Topic)
	}
	if !f.Since.IsZero() {
		where = append(where, "d.dead_lettered_at >= ?")
		args = append(args, f.Since.UTC())
	}
	if !f.Until.IsZero() {
		where = append(where, "d.dead_lettered_at < ?")
		args = append(args, f.Until.UTC())
	}
	if f.Error != "" {
		// LOCATE, not LIKE: the text may hold % and _.
		where = append(where, "LOCATE(LOWER(?), LOWER(d.last_error)) > 0")
		args = append(args, f.Error)
	}
	args = append(args, f.Limit)
	rows, err := s.db.QueryContext(ctx, `SELECT `+deadLetterColumns+` FROM `+s.dead+` d
WHERE `+strings.Join(where, " AND ")+`
ORDER BY d.dead_lettered_at DESC, d.id DESC
LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := scanDeadLetters(rows)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// DeadLetters returns the dead letters of a message, oldest first.
func (s *Store) DeadLetters(ctx context.Context, messageID uuid.UUID) ([]storedriver.DeadLetterRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+deadLetterColumns+` FROM `+s.dead+` d WHERE d.message_id = ? ORDER BY d.id`, messageID.String())
	if err != nil {
		return nil, fmt.Errorf("list dead letters of %s: %w", messageID, err)
	}
	out, err := scanDeadLetters(rows)
	if err != nil {
		return nil, fmt.Errorf("list dead letters of %s: %w", messageID, err)
	}
	return out, nil
}

// DeadLetterRunIDs returns the run IDs of the message's dead letters, oldest first: the
// runs that gave up on it, whether their dead letter is still open or was redriven or
// discarded since. None for a message never dead-lettered.
func (s *Store) DeadLetterRunIDs(ctx context.Context, messageID uuid.UUID) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT run_id FROM `+s.dead+` WHERE message_id = ? ORDER BY id`, messageID.String())
	if err != nil {
		return nil, fmt.Errorf("list the runs that dead-lettered %s: %w", messageID, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("list the runs that dead-lettered %s: %w", messageID, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the runs that dead-lettered %s: %w", messageID, err)
	}
	return ids, nil
}

// Audit returns the operator actions on a message (and reconciliation's repairs), oldest
// first.
func (s *Store) Audit(ctx context.Context, messageID uuid.UUID) ([]storedriver.AuditEntry, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT message_id, dead_letter_id, action, actor, `at`, detail FROM "+s.audit+
		" WHERE message_id = ? ORDER BY `at`, id", messageID.String())
	if err != nil {
		return nil, fmt.Errorf("read audit of %s: %w", messageID, err)
	}
	defer rows.Close()
	var out []storedriver.AuditEntry
	for rows.Next() {
		var a storedriver.AuditEntry
		if err := rows.Scan(&a.MessageID, &a.DeadLetterID, &a.Action, &a.Actor, &a.At, &a.Detail); err != nil {
			return nil, fmt.Errorf("read audit of %s: %w", messageID, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read audit of %s: %w", messageID, err)
	}
	return out, nil
}

// Redrive puts a dead-lettered message back to be delivered again: dead → pending, with
// retry_times reset and redrive_count incremented; its open dead letter is marked
// redriven by actor, and the action is audited, in one transaction. Of concurrent
// redrives of one message exactly one succeeds; the others, and a redrive of a message
// that is not dead, return a *storedriver.NotDeadError. A missing message returns an error
// wrapping storedriver.ErrNotFound. The relays poll, so nothing is notified.
func (s *Store) Redrive(ctx context.Context, messageID uuid.UUID, actor string) (storedriver.Redriven, error) {
	return s.redrive(ctx, messageID, 0, actor)
}

// RedriveDeadLetter is Redrive guarded by the dead letter an operator chose (see
// storedriver.Operations).
func (s *Store) RedriveDeadLetter(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) (storedriver.Redriven, error) {
	if deadLetterID <= 0 {
		return storedriver.Redriven{}, fmt.Errorf("redrive: dead letter ID must be positive, got %d", deadLetterID)
	}
	return s.redrive(ctx, messageID, deadLetterID, actor)
}

func (s *Store) redrive(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) (storedriver.Redriven, error) {
	r := storedriver.Redriven{MessageID: messageID}
	err := s.operate(ctx, messageID, deadLetterID, actor, "redrive", `UPDATE `+s.messages+`
SET status = 'pending', retry_times = 0, next_retry_at = NULL, claim_token = NULL, lease_until = NULL,
    dispatched_at = NULL, sent_at = NULL, redrive_count = redrive_count + 1, updated_at = NOW(6)
WHERE message_id = ? AND status = 'dead'`, "redriven", func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `SELECT topic, redrive_count FROM `+s.messages+` WHERE message_id = ?`, messageID.String()).
			Scan(&r.Topic, &r.RedriveCount)
	})
	if err != nil {
		return storedriver.Redriven{}, fmt.Errorf("redrive: %w", err)
	}
	return r, nil
}

// Discard records that an operator gave up on a dead-lettered message: dead → discarded,
// its open dead letter marked discarded by actor, the action audited, and for a keyed
// message its key released, in one transaction. A message that is not dead returns a
// *storedriver.NotDeadError; a missing one an error wrapping storedriver.ErrNotFound.
func (s *Store) Discard(ctx context.Context, messageID uuid.UUID, actor string) error {
	return s.discard(ctx, messageID, 0, actor)
}

// DiscardDeadLetter is Discard guarded by the dead letter an operator chose (see
// storedriver.Operations).
func (s *Store) DiscardDeadLetter(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) error {
	if deadLetterID <= 0 {
		return fmt.Errorf("discard: dead letter ID must be positive, got %d", deadLetterID)
	}
	return s.discard(ctx, messageID, deadLetterID, actor)
}

func (s *Store) discard(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) error {
	err := s.operate(ctx, messageID, deadLetterID, actor, "discard", `UPDATE `+s.messages+`
SET status = 'discarded', updated_at = NOW(6), held_back = FALSE
WHERE message_id = ? AND status = 'dead'`, "discarded", func(tx *sql.Tx) error {
		var key sql.NullString
		if err := tx.QueryRowContext(ctx, `SELECT ordering_key FROM `+s.messages+` WHERE message_id = ?`, messageID.String()).Scan(&key); err != nil {
			return err
		}
		if key.Valid {
			return s.release(ctx, tx, key.String)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("discard: %w", err)
	}
	return nil
}

// operate runs an operator action in one transaction: the guarded message UPDATE (which
// holds the row against a concurrent dead-lettering or operator action), then after (which
// reads what the caller needs), the check that deadLetterID (when not 0) is the message's
// one open dead letter, the open dead letters' UPDATE (deadPrefix, "redriven" or
// "discarded", says which columns) and the audit row.
func (s *Store) operate(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor, action, messageSQL, deadPrefix string, after func(tx *sql.Tx) error) error {
	if strings.TrimSpace(actor) == "" {
		return errors.New("actor must name who acts (a user or a tool), got an empty string")
	}
	actor = storedriver.StorableText(actor)
	return s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, messageSQL, messageID.String())
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			var status storedriver.Status
			err := tx.QueryRowContext(ctx, `SELECT status FROM `+s.messages+` WHERE message_id = ?`, messageID.String()).Scan(&status)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("message %s: %w", messageID, storedriver.ErrNotFound)
			}
			if err != nil {
				return err
			}
			return &storedriver.NotDeadError{MessageID: messageID, Status: status}
		}
		if err := after(tx); err != nil {
			return err
		}
		open, err := queryIDs(ctx, tx, `SELECT id FROM `+s.dead+`
WHERE message_id = ? AND redriven_at IS NULL AND discarded_at IS NULL ORDER BY id FOR UPDATE`, messageID.String())
		if err != nil {
			return err
		}
		if deadLetterID != 0 && !slices.Equal(open, []int64{deadLetterID}) {
			return &storedriver.DeadLetterChangedError{MessageID: messageID, DeadLetterID: deadLetterID}
		}
		var audited *int64
		if len(open) > 0 {
			audited = &open[0]
			if _, err := tx.ExecContext(ctx, `UPDATE `+s.dead+` SET `+deadPrefix+`_at = NOW(6), `+deadPrefix+`_by = ?
WHERE id IN (`+idList(open)+`)`, actor); err != nil {
				return err
			}
		}
		return s.writeAudit(ctx, tx, messageID, audited, action, actor, nil)
	})
}

// writeAudit adds an audit row in tx: an operator's action on a dead letter, or
// reconciliation's repair with what it found (detail).
func (s *Store) writeAudit(ctx context.Context, tx *sql.Tx, messageID uuid.UUID, deadLetterID *int64, action, actor string, detail *string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO `+s.audit+` (message_id, dead_letter_id, action, actor, detail) VALUES (?, ?, ?, ?, ?)`,
		messageID.String(), deadLetterID, action, actor, detail)
	return err
}
