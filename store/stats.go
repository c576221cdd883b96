package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-go/outbox/store/storedriver"
)

// Stats reads the counts in one repeatable-read transaction, so they agree with each
// other. Counting by topic reads the whole message table.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	st := Stats{ByStatus: map[Status]int64{}, ByTopic: map[string]map[Status]int64{}}
	for _, status := range Statuses {
		st.ByStatus[status] = 0
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("stats: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`); err != nil {
		return st, fmt.Errorf("stats: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT topic, status, count(*) FROM `+s.messages+` GROUP BY topic, status`)
	if err != nil {
		return st, fmt.Errorf("stats: count messages: %w", err)
	}
	var topic string
	var status Status
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&topic, &status, &n}, func() error {
		st.ByStatus[status] += n
		if st.ByTopic[topic] == nil {
			st.ByTopic[topic] = map[Status]int64{}
		}
		st.ByTopic[topic][status] = n
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("stats: count messages: %w", err)
	}
	var pendingAge, inFlightAge *time.Duration
	var claimedLive int64
	err = tx.QueryRow(ctx, `SELECT now(),
  (SELECT now() - min(created_at) FROM `+s.messages+`
     WHERE (status = 'pending' OR status = 'claimed' AND lease_until <= now())
       AND (next_retry_at IS NULL OR next_retry_at <= now())
       AND (NOT held_back OR ordering_key IS NULL) AND topic NOT IN (SELECT topic FROM `+s.pauses+`)),
  now() - LEAST(
    (SELECT min(coalesce(dispatched_at, updated_at)) FROM `+s.messages+` WHERE status = 'dispatched'),
    (SELECT min(updated_at) FROM `+s.messages+` WHERE status = 'claimed' AND lease_until > now() AND NOT held_back)),
  (SELECT count(*) FROM `+s.messages+` WHERE status = 'claimed' AND lease_until > now() AND NOT held_back),
  (SELECT count(*) FROM `+s.dead+` WHERE redriven_at IS NULL AND discarded_at IS NULL),
  (SELECT count(*) FROM `+s.dead+` WHERE dead_lettered_at >= now() - interval '1 hour'),
  (SELECT count(*) FROM `+s.dead+` WHERE dead_lettered_at >= now() - interval '1 day'),
  (SELECT count(*) FROM `+s.messages+` m
     WHERE m.status = 'pending' AND m.ordering_key IS NOT NULL AND EXISTS (
       SELECT 1 FROM `+s.messages+` e WHERE e.ordering_key = m.ordering_key AND e.ordering_seq < m.ordering_seq
         AND e.status IN ('pending', 'claimed', 'dispatched', 'dead'))),
  (SELECT count(DISTINCT d.ordering_key) FROM `+s.messages+` d
     WHERE d.status = 'dead' AND d.ordering_key IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM `+s.messages+` e WHERE e.ordering_key = d.ordering_key AND e.ordering_seq < d.ordering_seq
         AND e.status IN ('pending', 'claimed', 'dispatched', 'dead'))
       AND EXISTS (SELECT 1 FROM `+s.messages+` l WHERE l.ordering_key = d.ordering_key AND l.ordering_seq > d.ordering_seq
         AND l.status = 'pending')),
  (SELECT count(*) FROM `+s.audit+` WHERE action = 'reconcile' AND at >= now() - interval '1 day')`).
		Scan(&st.At, &pendingAge, &inFlightAge, &claimedLive, &st.OpenDeadLetters, &st.DeadLettersLastHour, &st.DeadLettersLastDay,
			&st.HeldBack, &st.KeysBlockedByDead, &st.RepairedLastDay)
	if err != nil {
		return st, fmt.Errorf("stats: %w", err)
	}
	// In flight: dispatched, or claimed under a live lease and not parked (a claimed row
	// whose lease ran out, or that a claim parked, waits for a relay).
	st.InFlight = st.ByStatus[StatusDispatched] + claimedLive
	if pendingAge != nil {
		st.OldestPendingAge = max(*pendingAge, 0)
	}
	if inFlightAge != nil {
		st.OldestInFlightAge = max(*inFlightAge, 0)
	}
	rows, err = tx.Query(ctx, `SELECT topic, paused_at, paused_by, reason FROM `+s.pauses+` ORDER BY topic`)
	if err != nil {
		return st, fmt.Errorf("stats: paused topics: %w", err)
	}
	if st.Paused, err = pgx.CollectRows(rows, scanPause); err != nil {
		return st, fmt.Errorf("stats: paused topics: %w", err)
	}
	return st, nil
}

// backlogSQL counts the rows waiting for a relay, by topic. Each branch's WHERE clause is
// the predicate of one of the claim's partial indexes (due at once, delayed, held back), so
// it finds the rows through those indexes, not among the table's sent rows, and reads only
// the waiting rows themselves (their topic). The age is that of the oldest row that is
// due and not held back behind its ordering key: pending with next_retry_at passed or
// unset, claimed, or parked without a key, which is waiting for room under its topic's
// limit of messages in flight (or for its topic's resume: Backlog reports a paused topic
// with age zero).
const backlogSQL = `SELECT topic, count(*),
  COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE due)), 0)::float8
FROM (
  SELECT topic, created_at, true AS due FROM %[1]s
   WHERE status IN ('pending', 'claimed') AND next_retry_at IS NULL AND NOT held_back
  UNION ALL
  SELECT topic, created_at, next_retry_at <= now() FROM %[1]s
   WHERE status IN ('pending', 'claimed') AND next_retry_at IS NOT NULL AND NOT held_back
  UNION ALL
  SELECT topic, created_at, ordering_key IS NULL FROM %[1]s
   WHERE held_back AND status IN ('pending', 'claimed')
) waiting
GROUP BY topic
ORDER BY topic`

// Backlog implements Delivery.
func (s *Store) Backlog(ctx context.Context) ([]TopicBacklog, error) {
	rows, err := s.db.Query(ctx, fmt.Sprintf(backlogSQL, s.messages))
	if err != nil {
		return nil, fmt.Errorf("read the backlog: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TopicBacklog, error) {
		var b TopicBacklog
		var age float64
		err := row.Scan(&b.Topic, &b.Pending, &age)
		b.OldestAge = max(time.Duration(age*float64(time.Second)), 0)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the backlog: %w", err)
	}
	paused, err := s.PausedTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the backlog: %w", err)
	}
	return storedriver.WithPaused(out, paused), nil
}
