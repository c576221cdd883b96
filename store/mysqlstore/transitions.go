package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

// MarkSent records a delivered message: pending, claimed or dispatched → sent. ok is false
// when the row is already terminal or does not exist. It is RecordSent without the metrics.
func (s *Store) MarkSent(ctx context.Context, messageID uuid.UUID) (ok bool, err error) {
	sent, err := s.RecordSent(ctx, messageID)
	return sent != nil, err
}

// RecordSent is MarkSent returning what metrics need of the row it changed; nil when the
// row is already terminal or does not exist. When the message has an ordering key, the
// same transaction releases the key's next parked message.
func (s *Store) RecordSent(ctx context.Context, messageID uuid.UUID) (*storedriver.Sent, error) {
	sent, err := s.RecordSentAll(ctx, []uuid.UUID{messageID})
	if len(sent) == 0 {
		return nil, err
	}
	return &sent[0], err
}

// RecordSentAll is RecordSent for many messages in one transaction: the delivered messages
// of a batch run. It returns the rows it moved.
func (s *Store) RecordSentAll(ctx context.Context, messageIDs []uuid.UUID) ([]storedriver.Sent, error) {
	if len(messageIDs) == 0 {
		return nil, nil
	}
	var sent []storedriver.Sent
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		sent, err = s.markSent(ctx, tx, messageIDs, nil)
		return err
	})
	if err != nil {
		return nil, err
	}
	return sent, nil
}

// markSent is the one writer of → sent: pending, claimed or dispatched → sent, for the
// rows of messageIDs, in tx. With unchanged, the one row moves only while it is still the
// dispatched row unchanged was read from, not updated since (reconciliation's guard). It
// locks the rows that move, moves them with one UPDATE, releases their ordering keys and
// returns what metrics need of them (MySQL has no RETURNING).
func (s *Store) markSent(ctx context.Context, tx *sql.Tx, messageIDs []uuid.UUID, unchanged *storedriver.Dispatched) ([]storedriver.Sent, error) {
	fail := func(err error) ([]storedriver.Sent, error) {
		if len(messageIDs) == 1 {
			return nil, fmt.Errorf("mark message sent: %w", err)
		}
		return nil, fmt.Errorf("mark %d messages sent: %w", len(messageIDs), err)
	}
	guard, args := "", []any(nil)
	if unchanged != nil {
		guard = " AND " + stillDispatched
		args = append(args, unchanged.ID, unchanged.UpdatedAt)
	}
	rows, err := tx.QueryContext(ctx, `SELECT id, message_id, topic, ordering_key FROM `+s.messages+`
WHERE message_id IN (`+uuidList(messageIDs)+`) AND status IN ('pending', 'claimed', 'dispatched')`+guard+`
FOR UPDATE`, args...)
	if err != nil {
		return fail(err)
	}
	var (
		ids  []int64
		sent []storedriver.Sent
		keys []string
	)
	for rows.Next() {
		var (
			id  int64
			m   storedriver.Sent
			key sql.NullString
		)
		if err := rows.Scan(&id, &m.MessageID, &m.Topic, &key); err != nil {
			rows.Close()
			return fail(err)
		}
		ids, sent = append(ids, id), append(sent, m)
		if key.Valid && !slices.Contains(keys, key.String) {
			keys = append(keys, key.String)
		}
	}
	if err := rows.Close(); err != nil {
		return fail(err)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+s.messages+`
SET status = 'sent', sent_at = NOW(6), claim_token = NULL, lease_until = NULL, updated_at = NOW(6), held_back = FALSE
WHERE id IN (`+idList(ids)+`)`); err != nil {
		return fail(err)
	}
	latency, err := tx.QueryContext(ctx, `SELECT message_id, TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) FROM `+s.messages+`
WHERE id IN (`+idList(ids)+`)`)
	if err != nil {
		return fail(err)
	}
	byID := make(map[uuid.UUID]time.Duration, len(ids))
	for latency.Next() {
		var id uuid.UUID
		var us int64
		if err := latency.Scan(&id, &us); err != nil {
			latency.Close()
			return fail(err)
		}
		byID[id] = time.Duration(us) * time.Microsecond
	}
	if err := latency.Close(); err != nil {
		return fail(err)
	}
	if err := latency.Err(); err != nil {
		return fail(err)
	}
	for i := range sent {
		sent[i].Latency = byID[sent[i].MessageID]
	}
	// In byte order, as every writer of several keys takes them, so two never deadlock.
	slices.Sort(keys)
	for _, key := range keys {
		if err := s.release(ctx, tx, key); err != nil {
			return fail(err)
		}
	}
	return sent, nil
}

// RecordFailure records a failed delivery attempt on the row: retry_times becomes the
// number of failed attempts (it never decreases) and last_error the failure.
func (s *Store) RecordFailure(ctx context.Context, messageID uuid.UUID, failedAttempts int, lastError string) (ok bool, err error) {
	return s.exec(ctx, "record delivery failure", `UPDATE `+s.messages+`
SET retry_times = GREATEST(retry_times, ?), last_error = ?, updated_at = NOW(6)
WHERE message_id = ? AND status IN ('pending', 'claimed', 'dispatched')`, failedAttempts, storedriver.StorableText(lastError), messageID.String())
}

// selectRows reads rows as scanRow scans them, with whether their topic is paused, up to
// the WHERE.
func (s *Store) selectRows() string {
	return `SELECT id, message_id, topic, payload, headers, status, retry_times, max_retry_times,
next_retry_at, last_error, redrive_count, created_at, updated_at, sent_at, ordering_key, ordering_seq, batch_id, held_back,
topic IN (SELECT topic FROM ` + s.pauses + `) FROM ` + s.messages
}

// rowScanner is a *sql.Row or *sql.Rows.
type rowScanner interface{ Scan(dest ...any) error }

func scanRow(r rowScanner) (storedriver.Row, error) {
	var m storedriver.Row
	var payload, headers []byte
	err := r.Scan(&m.ID, &m.MessageID, &m.Topic, &payload, &headers, &m.Status, &m.RetryTimes,
		&m.MaxRetryTimes, &m.NextRetryAt, &m.LastError, &m.RedriveCount, &m.CreatedAt, &m.UpdatedAt, &m.SentAt,
		&m.OrderingKey, &m.OrderingSeq, &m.BatchID, &m.HeldBack, &m.Paused)
	if errors.Is(err, sql.ErrNoRows) {
		return m, storedriver.ErrNotFound
	}
	if err != nil {
		return m, err
	}
	m.Payload = payload
	if len(headers) > 0 {
		m.Headers = storedriver.ParseHeaders(headers) // headers of another shape are left out, not fatal
	}
	return m, nil
}

// Get loads a message by its message ID. It returns an error wrapping storedriver.ErrNotFound if
// there is none.
func (s *Store) Get(ctx context.Context, messageID uuid.UUID) (storedriver.Row, error) {
	m, err := scanRow(s.db.QueryRowContext(ctx, s.selectRows()+` WHERE message_id = ?`, messageID.String()))
	if err != nil {
		return m, fmt.Errorf("load message %s: %w", messageID, err)
	}
	return m, nil
}

// GetAll loads the messages of messageIDs, by message ID, in one statement. An ID without
// a row is left out.
func (s *Store) GetAll(ctx context.Context, messageIDs []uuid.UUID) (map[uuid.UUID]storedriver.Row, error) {
	out := make(map[uuid.UUID]storedriver.Row, len(messageIDs))
	if len(messageIDs) == 0 {
		return out, nil
	}
	rows, err := s.db.QueryContext(ctx, s.selectRows()+` WHERE message_id IN (`+uuidList(messageIDs)+`)`)
	if err != nil {
		return nil, fmt.Errorf("load %d messages: %w", len(messageIDs), err)
	}
	defer rows.Close()
	for rows.Next() {
		m, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("load %d messages: %w", len(messageIDs), err)
		}
		out[m.MessageID] = m
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load %d messages: %w", len(messageIDs), err)
	}
	return out, nil
}

// DeadLetter writes a dead letter for the message (copying its topic, payload and headers)
// and moves the row to dead, in one transaction, as package store does: dead letters are
// keyed by (message ID, run ID), so a second call for the same run changes nothing and
// succeeds, even when the dead letter has been redriven or discarded meanwhile; a row that
// is already sent or discarded is left alone and gets no dead letter; ok reports whether
// the row moved to dead. A keyed message moved to dead releases its key.
func (s *Store) DeadLetter(ctx context.Context, d storedriver.DeadLetter) (ok bool, err error) {
	d.LastError = storedriver.StorableText(d.LastError)
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		ok = false
		var (
			status    string
			topic     = d.Topic
			payload   = []byte("null")
			headers   []byte
			createdAt *time.Time
			key       sql.NullString
		)
		err := tx.QueryRowContext(ctx, `SELECT status, topic, payload, headers, created_at, ordering_key FROM `+s.messages+`
WHERE message_id = ? FOR UPDATE`, d.MessageID.String()).Scan(&status, &topic, &payload, &headers, &createdAt, &key)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			status = ""
		case err != nil:
			return err
		case storedriver.Status(status) == storedriver.StatusSent || storedriver.Status(status) == storedriver.StatusDiscarded:
			return nil
		}
		var headersText *string
		if headers != nil {
			h := string(headers)
			headersText = &h
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO `+s.dead+`
(message_id, workflow_id, run_id, topic, payload, headers, attempts, last_error, message_created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			d.MessageID.String(), d.WorkflowID, d.RunID, topic, string(payload), headersText, d.Attempts, d.LastError, createdAt)
		if isDuplicate(err, "outbox_dead_letters", "outbox_dead_letters_message_run_key") {
			// This run dead-lettered the message already, and that moved the row to dead
			// in the same transaction. Whatever happened to the row since came later and
			// stands. (The failed INSERT is undone alone; the transaction goes on.)
			return nil
		}
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE `+s.messages+`
SET status = 'dead', last_error = ?, claim_token = NULL, lease_until = NULL, updated_at = NOW(6), held_back = FALSE
WHERE message_id = ? AND status IN ('pending', 'claimed', 'dispatched')`, d.LastError, d.MessageID.String())
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		ok = n > 0
		if ok && key.Valid {
			return s.release(ctx, tx, key.String)
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("dead-letter message %s: %w", d.MessageID, err)
	}
	return ok, nil
}
