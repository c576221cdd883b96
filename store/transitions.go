package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Claimed is a row a relay has claimed: it holds the row's lease until LeaseUntil and
// proves it with ClaimToken.
type Claimed struct {
	ID            int64
	MessageID     uuid.UUID
	Topic         string
	RetryTimes    int
	MaxRetryTimes *int
	RedriveCount  int
	CreatedAt     time.Time
	// DispatchedAt is when a workflow last took the message over; nil for a message
	// handed over for the first time.
	DispatchedAt *time.Time
	ClaimToken   uuid.UUID
	LeaseUntil   time.Time
}

// MayHaveBeenSent reports whether an earlier delivery of the message may have reached the
// downstream: it was handed over to a workflow before, failed an attempt before, or was
// redriven. Its next run then asks check-processed before it sends.
func (c Claimed) MayHaveBeenSent() bool {
	return c.DispatchedAt != nil || c.RetryTimes > 0 || c.RedriveCount > 0
}

// The claim: one short statement. The CTE's first condition repeats the claim index's
// predicate, so the planner walks outbox_messages_claim_idx in id order; SKIP LOCKED lets
// concurrent relays take disjoint batches; MATERIALIZED makes the row choice run once (a
// subquery in IN (...) may be re-run by the planner, and each run would lock other rows);
// all times come from the database clock.
//
// A message with an ordering key is due only when no earlier message of its key (lower
// ordering_seq, any topic) is undelivered: pending, claimed, dispatched, or dead where
// the dead message's topic blocks its key. Since a key's sequence order is its commit
// order, this hands the key's messages to Temporal one at a time in commit order. Topics
// with ordering off are never held back.
const claimSQL = `WITH due AS MATERIALIZED (
    SELECT m.id FROM %[1]s m
    WHERE m.status IN ('pending', 'claimed')
      AND ((m.status = 'pending' AND (m.next_retry_at IS NULL OR m.next_retry_at <= now()))
        OR (m.status = 'claimed' AND m.lease_until <= now()))
      AND (m.ordering_key IS NULL
        OR (CASE WHEN m.topic = ANY($4) THEN m.topic = ANY($5) ELSE $6 END)
        OR NOT EXISTS (
          SELECT 1 FROM %[1]s e
          WHERE e.ordering_key = m.ordering_key AND e.ordering_seq < m.ordering_seq
            AND (e.status IN ('pending', 'claimed', 'dispatched')
              OR (e.status = 'dead' AND NOT (CASE WHEN e.topic = ANY($4) THEN e.topic = ANY($7) ELSE $8 END)))))
    ORDER BY m.id
    LIMIT $3
    FOR UPDATE OF m SKIP LOCKED)
UPDATE %[1]s AS m
SET status = 'claimed',
    claim_token = $1,
    lease_until = now() + make_interval(secs => $2),
    updated_at = now()
FROM due
WHERE m.id = due.id
RETURNING m.id, m.message_id, m.topic, m.retry_times, m.max_retry_times, m.redrive_count,
          m.created_at, m.dispatched_at, m.claim_token, m.lease_until`

// OrderingRules are the per-topic ordering settings the claim applies. The zero value
// orders every keyed message and lets a dead message block its key.
type OrderingRules struct {
	// Listed are the topics the settings below name one by one; every other topic takes
	// the defaults.
	Listed []string
	// Unordered are the listed topics whose messages are never held back by their key.
	Unordered []string
	// DefaultUnordered applies to topics not listed.
	DefaultUnordered bool
	// Skipping are the listed topics whose dead messages do not block their key: later
	// messages of the key are delivered anyway.
	Skipping []string
	// DefaultSkipping applies to topics not listed.
	DefaultSkipping bool
}

func (o OrderingRules) args() []any {
	nonNil := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	return []any{nonNil(o.Listed), nonNil(o.Unordered), o.DefaultUnordered, nonNil(o.Skipping), o.DefaultSkipping}
}

// ClaimSQL returns the claim statement for this store's table, for EXPLAIN. Its
// parameters are the claim token, the lease in seconds, the limit and OrderingRules.args.
func (s *Store) ClaimSQL() string { return fmt.Sprintf(claimSQL, s.messages) }

// Claim takes up to limit due rows (pending rows whose next_retry_at has passed, and
// claimed rows whose lease has expired) and leases them for lease, ordering keyed
// messages by the default rules.
func (s *Store) Claim(ctx context.Context, limit int, lease time.Duration) ([]Claimed, error) {
	return s.ClaimOrdered(ctx, limit, lease, OrderingRules{})
}

// ClaimOrdered is Claim with the ordering rules of the configured topics.
func (s *Store) ClaimOrdered(ctx context.Context, limit int, lease time.Duration, rules OrderingRules) ([]Claimed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("claim limit must be at least 1, got %d", limit)
	}
	token, err := uuid.NewRandom()
	if err != nil {
		return nil, fmt.Errorf("new claim token: %w", err)
	}
	args := append([]any{token, lease.Seconds(), limit}, rules.args()...)
	rows, err := s.db.Query(ctx, s.ClaimSQL(), args...)
	if err != nil {
		return nil, fmt.Errorf("claim messages: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claimed, error) {
		var c Claimed
		err := r.Scan(&c.ID, &c.MessageID, &c.Topic, &c.RetryTimes, &c.MaxRetryTimes, &c.RedriveCount,
			&c.CreatedAt, &c.DispatchedAt, &c.ClaimToken, &c.LeaseUntil)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim messages: %w", err)
	}
	return claimed, nil
}

// exec runs a guarded UPDATE and reports whether it changed a row.
func (s *Store) exec(ctx context.Context, what, sql string, args ...any) (bool, error) {
	tag, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return tag.RowsAffected() > 0, nil
}

// MarkDispatched records that a workflow owns the claimed row: claimed → dispatched, only
// while the caller still holds the claim. ok is false when the row has moved on (its
// workflow already finished, or the lease expired and another relay took it).
func (s *Store) MarkDispatched(ctx context.Context, id int64, token uuid.UUID) (ok bool, err error) {
	return s.exec(ctx, "mark message dispatched", `UPDATE `+s.messages+`
SET status = 'dispatched', claim_token = NULL, lease_until = NULL, dispatched_at = now(), updated_at = now()
WHERE id = $1 AND status = 'claimed' AND claim_token = $2`, id, token)
}

// MarkSent records a delivered message: pending, claimed or dispatched → sent. ok is false
// when the row is already terminal or does not exist.
func (s *Store) MarkSent(ctx context.Context, messageID uuid.UUID) (ok bool, err error) {
	return s.exec(ctx, "mark message sent", `UPDATE `+s.messages+`
SET status = 'sent', sent_at = now(), claim_token = NULL, lease_until = NULL, updated_at = now()
WHERE message_id = $1 AND status IN ('pending', 'claimed', 'dispatched')`, messageID)
}

// RecordFailure records a failed delivery attempt on the row: retry_times becomes the
// number of failed attempts (it never decreases) and last_error the failure.
func (s *Store) RecordFailure(ctx context.Context, messageID uuid.UUID, failedAttempts int, lastError string) (ok bool, err error) {
	return s.exec(ctx, "record delivery failure", `UPDATE `+s.messages+`
SET retry_times = GREATEST(retry_times, $2), last_error = $3, updated_at = now()
WHERE message_id = $1 AND status IN ('pending', 'claimed', 'dispatched')`, messageID, failedAttempts, StorableText(lastError))
}

const rowColumns = `id, message_id, topic, payload, headers, status, retry_times, max_retry_times,
next_retry_at, last_error, redrive_count, created_at, updated_at, sent_at, ordering_key, ordering_seq`

func scanRow(r pgx.Row) (Row, error) {
	var m Row
	var payload, headers []byte
	err := r.Scan(&m.ID, &m.MessageID, &m.Topic, &payload, &headers, &m.Status, &m.RetryTimes,
		&m.MaxRetryTimes, &m.NextRetryAt, &m.LastError, &m.RedriveCount, &m.CreatedAt, &m.UpdatedAt, &m.SentAt,
		&m.OrderingKey, &m.OrderingSeq)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, ErrNotFound
	}
	if err != nil {
		return m, err
	}
	m.Payload = payload
	if len(headers) > 0 {
		m.Headers = ParseHeaders(headers) // headers of another shape are left out, not fatal
	}
	return m, nil
}

// Get loads a message by its message ID. It returns ErrNotFound if there is none.
func (s *Store) Get(ctx context.Context, messageID uuid.UUID) (Row, error) {
	m, err := scanRow(s.db.QueryRow(ctx, `SELECT `+rowColumns+` FROM `+s.messages+` WHERE message_id = $1`, messageID))
	if err != nil {
		return m, fmt.Errorf("load message %s: %w", messageID, err)
	}
	return m, nil
}

// DeadLetter is the record of a message whose delivery gave up.
type DeadLetter struct {
	MessageID  uuid.UUID
	Topic      string // used when the message row no longer exists
	WorkflowID string
	RunID      string
	Attempts   int
	LastError  string
}

// DeadLetter writes a dead letter for the message (copying its topic, payload and headers)
// and moves the row to dead, in one transaction. Dead letters are keyed by (message ID, run
// ID), so a retried call writes nothing twice. A row that is already sent is left alone
// and gets no dead letter; ok reports whether the row moved to dead.
func (s *Store) DeadLetter(ctx context.Context, d DeadLetter) (ok bool, err error) {
	d.LastError = StorableText(d.LastError)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var status string
		var createdAt *time.Time
		topic, payload, headers := d.Topic, []byte("null"), []byte(nil)
		err := tx.QueryRow(ctx, `SELECT status, topic, payload, headers, created_at FROM `+s.messages+`
WHERE message_id = $1 FOR UPDATE`, d.MessageID).Scan(&status, &topic, &payload, &headers, &createdAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			status = ""
		case err != nil:
			return err
		case status == StatusSent || status == StatusDiscarded:
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.dead+`
(message_id, workflow_id, run_id, topic, payload, headers, attempts, last_error, message_created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (message_id, run_id) DO UPDATE
    -- The same run dead-letters the message again (its first dead letter was redriven
    -- while the run was still open): the dead letter is open again.
    SET redriven_at = NULL, redriven_by = NULL
    WHERE `+s.dead+`.redriven_at IS NOT NULL AND `+s.dead+`.discarded_at IS NULL`,
			d.MessageID, d.WorkflowID, d.RunID, topic, string(payload), headers, d.Attempts, d.LastError, createdAt); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE `+s.messages+`
SET status = 'dead', last_error = $2, claim_token = NULL, lease_until = NULL, updated_at = now()
WHERE message_id = $1 AND status IN ('pending', 'claimed', 'dispatched')`, d.MessageID, d.LastError)
		if err != nil {
			return err
		}
		ok = tag.RowsAffected() > 0
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("dead-letter message %s: %w", d.MessageID, err)
	}
	return ok, nil
}

// DeadLetterRecord is one row of outbox_dead_letters.
type DeadLetterRecord struct {
	ID               int64
	MessageID        uuid.UUID
	WorkflowID       string
	RunID            string
	Topic            string
	Payload          json.RawMessage
	Headers          map[string]string
	Attempts         int
	LastError        string
	MessageCreatedAt *time.Time
	DeadLetteredAt   time.Time
	RedrivenAt       *time.Time
	RedrivenBy       *string
	DiscardedAt      *time.Time
	DiscardedBy      *string
}

// DeadLetters returns the dead letters of a message, oldest first.
func (s *Store) DeadLetters(ctx context.Context, messageID uuid.UUID) ([]DeadLetterRecord, error) {
	rows, err := s.db.Query(ctx, `SELECT `+deadLetterColumns+` FROM `+s.dead+` d WHERE d.message_id = $1 ORDER BY d.id`, messageID)
	if err != nil {
		return nil, fmt.Errorf("list dead letters of %s: %w", messageID, err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list dead letters of %s: %w", messageID, err)
	}
	return out, nil
}
