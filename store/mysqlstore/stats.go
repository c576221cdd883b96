package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outbox-go/outbox/store/storedriver"
)

// Stats reads the counts in one REPEATABLE READ, read-only transaction, so they agree with
// each other (InnoDB reads every statement of it from one snapshot). Counting by topic
// reads the whole message table.
func (s *Store) Stats(ctx context.Context) (storedriver.Stats, error) {
	st := storedriver.Stats{ByStatus: map[storedriver.Status]int64{}, ByTopic: map[string]map[storedriver.Status]int64{}}
	for _, status := range storedriver.Statuses {
		st.ByStatus[status] = 0
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return st, fmt.Errorf("stats: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, `SELECT topic, status, COUNT(*) FROM `+s.messages+` GROUP BY topic, status`)
	if err != nil {
		return st, fmt.Errorf("stats: count messages: %w", err)
	}
	for rows.Next() {
		var topic string
		var status storedriver.Status
		var n int64
		if err := rows.Scan(&topic, &status, &n); err != nil {
			rows.Close()
			return st, fmt.Errorf("stats: count messages: %w", err)
		}
		st.ByStatus[status] += n
		if st.ByTopic[topic] == nil {
			st.ByTopic[topic] = map[storedriver.Status]int64{}
		}
		st.ByTopic[topic][status] = n
	}
	if err := rows.Close(); err != nil {
		return st, fmt.Errorf("stats: count messages: %w", err)
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("stats: count messages: %w", err)
	}
	// NOW(6) is one value throughout a statement, so the ages and windows agree.
	var pendingAge, dispatchedAge, claimedAge sql.NullInt64
	var claimedLive int64
	err = tx.QueryRowContext(ctx, `SELECT NOW(6),
  (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)) FROM `+s.messages+`
     WHERE (status = 'pending' OR status = 'claimed' AND lease_until <= NOW(6))
       AND (next_retry_at IS NULL OR next_retry_at <= NOW(6))
       AND (NOT held_back OR ordering_key IS NULL) AND topic NOT IN (SELECT topic FROM `+s.pauses+`)),
  (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(COALESCE(dispatched_at, updated_at)), NOW(6)) FROM `+s.messages+`
     WHERE status = 'dispatched'),
  (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(updated_at), NOW(6)) FROM `+s.messages+`
     WHERE status = 'claimed' AND lease_until > NOW(6) AND NOT held_back),
  (SELECT COUNT(*) FROM `+s.messages+` WHERE status = 'claimed' AND lease_until > NOW(6) AND NOT held_back),
  (SELECT COUNT(*) FROM `+s.dead+` WHERE redriven_at IS NULL AND discarded_at IS NULL),
  (SELECT COUNT(*) FROM `+s.dead+` WHERE dead_lettered_at >= NOW(6) - INTERVAL 1 HOUR),
  (SELECT COUNT(*) FROM `+s.dead+` WHERE dead_lettered_at >= NOW(6) - INTERVAL 1 DAY),
  (SELECT COUNT(*) FROM `+s.messages+` m
     WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND EXISTS (
       SELECT 1 FROM `+s.messages+` e WHERE e.ordering_key = m.ordering_key AND e.ordering_seq < m.ordering_seq
         AND e.status IN ('pending', 'claimed', 'dispatched', 'dead'))),
  (SELECT COUNT(DISTINCT d.ordering_key) FROM `+s.messages+` d
     WHERE d.status = 'dead' AND d.ordering_key IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM `+s.messages+` e WHERE e.ordering_key = d.ordering_key AND e.ordering_seq < d.ordering_seq
         AND e.status IN ('pending', 'claimed', 'dispatched', 'dead'))
       AND EXISTS (SELECT 1 FROM `+s.messages+` l WHERE l.ordering_key = d.ordering_key AND l.ordering_seq > d.ordering_seq
         AND l.status = 'pending')),
  (SELECT COUNT(*) FROM `+s.audit+" WHERE action = 'reconcile' AND `at` >= NOW(6) - INTERVAL 1 DAY)").
		Scan(&st.At, &pendingAge, &dispatchedAge, &claimedAge, &claimedLive, &st.OpenDeadLetters, &st.DeadLettersLastHour, &st.DeadLettersLastDay,
			&st.HeldBack, &st.KeysBlockedByDead, &st.RepairedLastDay)
	if err != nil {
		return st, fmt.Errorf("stats: %w", err)
	}
	// In flight: dispatched, or claimed under a live lease and not parked (a claimed row
	// whose lease ran out, or that a claim parked, waits for a relay).
	st.InFlight = st.ByStatus[storedriver.StatusDispatched] + claimedLive
	if pendingAge.Valid {
		st.OldestPendingAge = max(time.Duration(pendingAge.Int64)*time.Microsecond, 0)
	}
	// The oldest of the two: PostgreSQL's now() - LEAST(...), which skips a NULL.
	if dispatchedAge.Valid || claimedAge.Valid {
		st.OldestInFlightAge = max(time.Duration(max(dispatchedAge.Int64, claimedAge.Int64))*time.Microsecond, 0)
	}
	if st.Paused, err = s.pausedTopics(ctx, tx); err != nil {
		return st, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}

// backlogSQL counts the rows waiting for a relay, by topic: those on the claim's lanes and
// the held-back ones (pending or claimed), each found through an index (the lane index and
// outbox_messages_held_back_idx), not among the table's sent rows. The age is that of the
// oldest row that is due and not held back behind its key: lane 1, lane 2 with
// next_retry_at passed, or parked without a key, which is waiting for room under its
// topic's limit of messages in flight (or for its topic's resume: Backlog reports a paused
// topic with age zero).
const backlogSQL = `SELECT topic, COUNT(*),
  TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN due THEN created_at END), NOW(6))
FROM (
  SELECT topic, created_at,
         (claim_lane = 1 AND next_retry_at IS NULL) OR (claim_lane = 2 AND next_retry_at <= NOW(6)) AS due
    FROM %[1]s WHERE claim_lane IN (1, 2)
  UNION ALL
  SELECT topic, created_at, ordering_key IS NULL FROM %[1]s WHERE held_back = TRUE AND status IN ('pending', 'claimed')
) waiting
GROUP BY topic
ORDER BY topic`

// Backlog implements storedriver.Delivery.
func (s *Store) Backlog(ctx context.Context) ([]storedriver.TopicBacklog, error) {
	rows, err := s.db.QueryContext(ctx, fmt.Sprintf(backlogSQL, s.messages))
	if err != nil {
		return nil, fmt.Errorf("read the backlog: %w", err)
	}
	defer rows.Close()
	var out []storedriver.TopicBacklog
	for rows.Next() {
		var b storedriver.TopicBacklog
		var age sql.NullInt64
		if err := rows.Scan(&b.Topic, &b.Pending, &age); err != nil {
			return nil, fmt.Errorf("read the backlog: %w", err)
		}
		if age.Valid {
			b.OldestAge = max(time.Duration(age.Int64)*time.Microsecond, 0)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the backlog: %w", err)
	}
	paused, err := s.PausedTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the backlog: %w", err)
	}
	return storedriver.WithPaused(out, paused), nil
}
