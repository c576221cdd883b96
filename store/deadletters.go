package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

const deadLetterColumns = `d.id, d.message_id, d.workflow_id, d.run_id, d.topic, d.payload, d.headers, d.attempts,
d.last_error, d.message_created_at, d.dead_lettered_at, d.redriven_at, d.redriven_by, d.discarded_at, d.discarded_by`

func scanDeadLetter(r pgx.CollectableRow) (DeadLetterRecord, error) {
	var d DeadLetterRecord
	var payload, headers []byte
	err := r.Scan(&d.ID, &d.MessageID, &d.WorkflowID, &d.RunID, &d.Topic, &payload, &headers, &d.Attempts,
		&d.LastError, &d.MessageCreatedAt, &d.DeadLetteredAt, &d.RedrivenAt, &d.RedrivenBy, &d.DiscardedAt, &d.DiscardedBy)
	d.Payload = payload
	if len(headers) > 0 {
		_ = json.Unmarshal(headers, &d.Headers)
	}
	return d, err
}

// ListDeadLetters returns dead letters matching f, newest first.
func (s *Store) ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetterRecord, error) {
	if f.Limit == 0 {
		f.Limit = 100
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("limit must be positive, got %d", f.Limit)
	}
	where := []string{"true"}
	args := []any{}
	if !f.IncludeClosed {
		where = append(where, "d.redriven_at IS NULL AND d.discarded_at IS NULL")
	}
	if f.Topic != "" {
		args = append(args, f.Topic)
		where = append(where, fmt.Sprintf("d.topic = $%d", len(args)))
	}
	if !f.Since.IsZero() {
		args = append(args, f.Since)
		where = append(where, fmt.Sprintf("d.dead_lettered_at >= $%d", len(args)))
	}
	if !f.Until.IsZero() {
		args = append(args, f.Until)
		where = append(where, fmt.Sprintf("d.dead_lettered_at < $%d", len(args)))
	}
	if f.Error != "" {
		// strpos, not LIKE: the text may hold % and _.
		args = append(args, f.Error)
		where = append(where, fmt.Sprintf("strpos(lower(d.last_error), lower($%d)) > 0", len(args)))
	}
	args = append(args, f.Limit)
	rows, err := s.db.Query(ctx, `SELECT `+deadLetterColumns+` FROM `+s.dead+` d
WHERE `+strings.Join(where, " AND ")+`
ORDER BY d.dead_lettered_at DESC, d.id DESC
LIMIT $`+fmt.Sprint(len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// DeadLetterRunIDs returns the run IDs of the message's dead letters, oldest first: the
// runs that gave up on it, whether their dead letter is still open or was redriven or
// discarded since. None for a message never dead-lettered. Dead-lettering is a run's last
// step, so a run among them that is still running is closing (failed), and does not
// deliver the message: the relay waits for it to close instead of taking it for the owner
// of a redriven message.
func (s *Store) DeadLetterRunIDs(ctx context.Context, messageID uuid.UUID) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT run_id FROM `+s.dead+` WHERE message_id = $1 ORDER BY id`, messageID)
	if err != nil {
		return nil, fmt.Errorf("list the runs that dead-lettered %s: %w", messageID, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the runs that dead-lettered %s: %w", messageID, err)
	}
	return ids, nil
}

// Audit returns the operator actions on a message, oldest first.
func (s *Store) Audit(ctx context.Context, messageID uuid.UUID) ([]AuditEntry, error) {
	rows, err := s.db.Query(ctx, `SELECT message_id, dead_letter_id, action, actor, at, detail FROM `+s.audit+`
WHERE message_id = $1 ORDER BY at, id`, messageID)
	if err != nil {
		return nil, fmt.Errorf("read audit of %s: %w", messageID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		return a, r.Scan(&a.MessageID, &a.DeadLetterID, &a.Action, &a.Actor, &a.At, &a.Detail)
	})
	if err != nil {
		return nil, fmt.Errorf("read audit of %s: %w", messageID, err)
	}
	return out, nil
}

// Redrive puts a dead-lettered message back to be delivered again: dead → pending, with
// retry_times reset and redrive_count incremented; its open dead letter is marked
// redriven by actor, and the action is audited. The relay then starts a new run under the
// same workflow ID (the dead-lettered run failed, which the reuse policy allows). Of
// concurrent redrives of one message exactly one succeeds; the others, and a redrive of a
// message that is not dead, return a *NotDeadError. A missing message returns ErrNotFound.
func (s *Store) Redrive(ctx context.Context, messageID uuid.UUID, actor string) (Redriven, error) {
	return s.redrive(ctx, messageID, 0, actor)
}

// RedriveDeadLetter is Redrive of the message only while deadLetterID is its one open
// dead letter: the letter an operator chose from a list. When the message was redriven,
// discarded or dead-lettered again since, it returns a *DeadLetterChangedError and
// changes nothing.
func (s *Store) RedriveDeadLetter(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) (Redriven, error) {
	if deadLetterID <= 0 {
		return Redriven{}, fmt.Errorf("redrive: dead letter ID must be positive, got %d", deadLetterID)
	}
	return s.redrive(ctx, messageID, deadLetterID, actor)
}

func (s *Store) redrive(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) (Redriven, error) {
	r := Redriven{MessageID: messageID}
	err := s.operate(ctx, messageID, deadLetterID, actor, "redrive", `UPDATE `+s.messages+`
SET status = 'pending', retry_times = 0, next_retry_at = NULL, claim_token = NULL, lease_until = NULL,
    dispatched_at = NULL, sent_at = NULL, redrive_count = redrive_count + 1, updated_at = now()
WHERE message_id = $1 AND status = 'dead'
RETURNING topic, redrive_count`, "redriven", &r.Topic, &r.RedriveCount)
	if err != nil {
		return Redriven{}, fmt.Errorf("redrive: %w", err)
	}
	return r, nil
}

// Discard records that an operator gave up on a dead-lettered message: dead → discarded,
// its open dead letter marked discarded by actor, the action audited. A message that is not
// dead returns a *NotDeadError; a missing one ErrNotFound.
func (s *Store) Discard(ctx context.Context, messageID uuid.UUID, actor string) error {
	return s.discard(ctx, messageID, 0, actor)
}

// DiscardDeadLetter is Discard of the message only while deadLetterID is its one open
// dead letter: the letter an operator chose from a list. When the message was redriven,
// discarded or dead-lettered again since, it returns a *DeadLetterChangedError and
// changes nothing.
func (s *Store) DiscardDeadLetter(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) error {
	if deadLetterID <= 0 {
		return fmt.Errorf("discard: dead letter ID must be positive, got %d", deadLetterID)
	}
	return s.discard(ctx, messageID, deadLetterID, actor)
}

func (s *Store) discard(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor string) error {
	var topic string
	err := s.operate(ctx, messageID, deadLetterID, actor, "discard", `UPDATE `+s.messages+`
SET status = 'discarded', updated_at = now(), held_back = false
WHERE message_id = $1 AND status = 'dead'
RETURNING topic`, "discarded", &topic)
	if err != nil {
		return fmt.Errorf("discard: %w", err)
	}
	return nil
}

// operate runs an operator action in one transaction: the guarded message UPDATE (which
// scans into dest, and holds the row against a concurrent dead-lettering or operator
// action), the check that deadLetterID (when not 0) is the message's one open dead letter,
// the open dead letters' UPDATE (deadPrefix, "redriven" or "discarded", says which
// columns), the audit row, and for a redrive the notification that wakes the relays.
func (s *Store) operate(ctx context.Context, messageID uuid.UUID, deadLetterID int64, actor, action, messageSQL, deadPrefix string, dest ...any) error {
	if strings.TrimSpace(actor) == "" {
		return errors.New("actor must name who acts (a user or a tool), got an empty string")
	}
	actor = StorableText(actor)
	return s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, messageSQL, messageID).Scan(dest...)
		if errors.Is(err, pgx.ErrNoRows) {
			var status Status
			err := tx.QueryRow(ctx, `SELECT status FROM `+s.messages+` WHERE message_id = $1`, messageID).Scan(&status)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("message %s: %w", messageID, ErrNotFound)
			}
			if err != nil {
				return err
			}
			return &NotDeadError{MessageID: messageID, Status: status}
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE `+s.dead+` SET `+deadPrefix+`_at = now(), `+deadPrefix+`_by = $2
WHERE message_id = $1 AND redriven_at IS NULL AND discarded_at IS NULL
RETURNING id`, messageID, actor)
		if err != nil {
			return err
		}
		open, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		slices.Sort(open)
		if deadLetterID != 0 && !slices.Equal(open, []int64{deadLetterID}) {
			return &DeadLetterChangedError{MessageID: messageID, DeadLetterID: deadLetterID}
		}
		var audited *int64
		if len(open) > 0 {
			audited = &open[0]
		}
		if err := s.writeAudit(ctx, tx, messageID, audited, action, actor, nil); err != nil {
			return err
		}
		if action == "redrive" {
			return s.wake(ctx, tx)
		}
		return nil
	})
}

// writeAudit adds an audit row in tx: an operator's action on a dead letter, or
// reconciliation's repair with what it found (detail).
func (s *Store) writeAudit(ctx context.Context, tx pgx.Tx, messageID uuid.UUID, deadLetterID *int64, action, actor string, detail *string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+s.audit+` (message_id, dead_letter_id, action, actor, detail) VALUES ($1, $2, $3, $4, $5)`,
		messageID, deadLetterID, action, actor, detail)
	return err
}

// wake notifies the relays, when tx commits, that a row is pending again (a redrive, a
// hand-over again), whether or not the insert trigger's NOTIFY is on.
func (s *Store) wake(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, s.Channel())
	return err
}
