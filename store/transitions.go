package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The claim: one short statement. It reads two indexes whose predicates its conditions
// repeat, so the planner walks them and nothing else: rows due at once in id order, and
// delayed rows in next_retry_at order up to now(). SKIP LOCKED lets concurrent relays take
// disjoint batches; MATERIALIZED makes the row choice run once (a subquery may be re-run
// by the planner, and each run would lock other rows); all times come from the database
// clock.
//
// A message with an ordering key is due only when no earlier message of its key (lower
// ordering_seq, any topic) is undelivered: pending, claimed, dispatched, or dead where
// the dead message's topic blocks its key. Since a key's sequence order is its commit
// order, this hands the key's messages to Temporal one at a time in commit order. Topics
// with ordering off are never held back. A keyed row found held back is parked
// (held_back), which takes it off both indexes until the release trigger or the sweep
// unparks it, so held-back rows cost the claim nothing after the first look.
//
// A row without an ordering key whose topic (not paused) is at its limit of messages in
// flight (OrderingRules.InFlightLimit: $9, or the topic's entry in $10 and $11) is parked
// too: the topic's rows in flight (in_flight) and the rows before it in this claim count
// against the limit. Keyed rows are not limited, since their key lets one of them through
// at a time, but count as in flight. unparkLimitedSQL puts such rows back as the topic's
// messages finish.
//
// The result is the claimed rows, then one row whose last columns list the rows parked
// for their key or their topic's pause, their keys, and the number parked for the limit.
var claimSQL = `WITH delayed AS MATERIALIZED (
    SELECT m.id, m.topic, m.ordering_key, m.ordering_seq FROM %[1]s m
    WHERE m.status IN ('pending', 'claimed') AND m.next_retry_at IS NOT NULL AND NOT m.held_back
      AND m.next_retry_at <= now()
      AND (m.status = 'pending' OR m.lease_until <= now())
    ORDER BY m.next_retry_at, m.id
    LIMIT $3
    FOR UPDATE OF m SKIP LOCKED),
immediate AS MATERIALIZED (
    SELECT m.id, m.topic, m.ordering_key, m.ordering_seq FROM %[1]s m
    WHERE m.status IN ('pending', 'claimed') AND m.next_retry_at IS NULL AND NOT m.held_back
      AND (m.status = 'pending' OR m.lease_until <= now())
    ORDER BY m.id
    LIMIT $3 - (SELECT count(*) FROM delayed)
    FOR UPDATE OF m SKIP LOCKED),
candidates AS (SELECT * FROM delayed UNION ALL SELECT * FROM immediate),
limits AS (
    SELECT l.topic, l.lim FROM (
        SELECT t.topic, ` + topicLimit("t.topic", 9) + ` AS lim
        FROM (SELECT DISTINCT topic FROM candidates WHERE ordering_key IS NULL) t) l
    WHERE l.lim > 0 AND l.topic <> ALL (ARRAY(SELECT topic FROM %[2]s))),
in_flight AS (
    SELECT f.topic, count(*) AS n FROM %[1]s f
    WHERE f.status IN ('claimed', 'dispatched') AND ` + inFlight + `
      AND f.topic IN (SELECT topic FROM limits)
    GROUP BY f.topic),
due AS MATERIALIZED (
    SELECT c.id, limited OR (c.ordering_key IS NOT NULL AND ` + heldBack(4) + `) OR ` + paused + ` AS blocked, limited
    FROM (SELECT c.*, c.ordering_key IS NULL AND l.lim IS NOT NULL
            AND coalesce(f.n, 0) + count(*) FILTER (WHERE c.ordering_key IS NULL) OVER (PARTITION BY c.topic ORDER BY c.id) > l.lim AS limited
          FROM candidates c LEFT JOIN limits l ON l.topic = c.topic LEFT JOIN in_flight f ON f.topic = c.topic) c),
parked AS (
    UPDATE %[1]s AS p SET held_back = true
    FROM due WHERE p.id = due.id AND due.blocked
    RETURNING p.id, p.ordering_key, p.topic, due.limited),
claimed AS (
    UPDATE %[1]s AS m
    SET status = 'claimed',
        claim_token = $1,
        lease_until = now() + make_interval(secs => $2),
        updated_at = now()
    FROM due
    WHERE m.id = due.id AND NOT due.blocked
    RETURNING m.id, m.message_id, m.topic, m.retry_times, m.max_retry_times, m.redrive_count,
              m.created_at, m.dispatched_at, m.claim_token, m.lease_until, m.batch_id)
SELECT c.*, NULL::bigint[], NULL::text[], NULL::bigint, NULL::text[] FROM claimed c
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       (SELECT array_agg(id) FILTER (WHERE NOT limited) FROM parked),
       (SELECT coalesce(array_agg(DISTINCT ordering_key) FILTER (WHERE ordering_key IS NOT NULL), '{}') FROM parked),
       (SELECT count(*) FILTER (WHERE limited) FROM parked),
       (SELECT coalesce(array_agg(DISTINCT topic) FILTER (WHERE limited), '{}') FROM parked)`

// topicLimit returns the expression of topic's limit of messages in flight, whose
// limitArgs are the statement's parameters $p to $p+2 (OrderingRules.InFlightLimit): the
// topic's entry in the lists $p+1 and $p+2, or the default $p; 0 or less for none.
func topicLimit(topic string, p int) string {
	return fmt.Sprintf(`coalesce((SELECT x.n FROM unnest($%[2]d::text[], $%[3]d::int[]) AS x(topic, n) WHERE x.topic = %[1]s), $%[4]d)`,
		topic, p+1, p+2, p)
}

// limitArgs are the parameters of topicLimit for rules: the default limit, and the
// topics with a limit of their own and their limits.
func limitArgs(o OrderingRules) []any {
	topics := make([]string, 0, len(o.TopicMaxInFlight))
	limits := make([]int32, 0, len(o.TopicMaxInFlight))
	for t, n := range o.TopicMaxInFlight {
		topics, limits = append(topics, t), append(limits, int32(max(n, 0)))
	}
	return []any{int32(max(o.MaxInFlight, 0)), topics, limits}
}

// inFlight is the condition, true for a row f of status claimed or dispatched that a run
// holds or is about to: dispatched, or claimed under a lease that has not run out. A
// claimed row whose lease ran out waits for the next claim, and a parked one for its
// release.
const inFlight = `(f.status = 'dispatched' OR (f.lease_until > now() AND NOT f.held_back))`

// paused is the condition, true for a row c whose topic is paused; %[2]s is the pauses
// table, read once per statement (an InitPlan). The claim parks such a row, and no
// recheck or sweep unparks it while the pause lasts.
const paused = `c.topic = ANY (ARRAY(SELECT topic FROM %[2]s))`

// orderingArgs are the claim's parameters for rules.
func orderingArgs(o OrderingRules) []any {
	nonNil := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	return []any{nonNil(o.Listed), nonNil(o.Unordered), o.DefaultUnordered, nonNil(o.Skipping), o.DefaultSkipping}
}

// ClaimBatch takes up to limit due rows (pending rows whose next_retry_at has passed, and
// claimed rows whose lease has expired), leases them for lease, holds back keyed rows
// behind an earlier undelivered message of their key under rules, and reports the rows it
// parked. Under rules' limits of messages in flight it first puts back the parked rows of
// topics that have room (unparkLimited), parks a topic's rows beyond its room, and then
// the other due rows of a topic it found at its limit (parkFull).
func (s *Store) ClaimBatch(ctx context.Context, limit int, lease time.Duration, rules OrderingRules) (ClaimResult, error) {
	if limit < 1 {
		return ClaimResult{}, fmt.Errorf("claim limit must be at least 1, got %d", limit)
	}
	token, err := uuid.NewRandom()
	if err != nil {
		return ClaimResult{}, fmt.Errorf("new claim token: %w", err)
	}
	var waiting int
	if rules.LimitsInFlight() {
		if waiting, _, err = s.unparkLimited(ctx, rules); err != nil {
			return ClaimResult{}, err
		}
	}
	args := append(append([]any{token, lease.Seconds(), limit}, orderingArgs(rules)...), limitArgs(rules)...)
	rows, err := s.db.Query(ctx, fmt.Sprintf(claimSQL, s.messages, s.pauses), args...)
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claim messages: %w", err)
	}
	var (
		res        ClaimResult
		parkedIDs  []int64
		parkedKeys []string
		full       []string // the topics the claim found at their limit
	)
	for rows.Next() {
		var (
			c                   Claimed
			id                  *int64
			messageID, token    uuid.NullUUID
			topic               *string
			retryTimes, redrive *int
			createdAt, until    *time.Time
			batch               *string
			ids                 []int64
			keys                []string
			limited             *int64
			limitedTopics       []string
		)
		if err := rows.Scan(&id, &messageID, &topic, &retryTimes, &c.MaxRetryTimes, &redrive,
			&createdAt, &c.DispatchedAt, &token, &until, &batch, &ids, &keys, &limited, &limitedTopics); err != nil {
			rows.Close()
			return ClaimResult{}, fmt.Errorf("claim messages: %w", err)
		}
		if id == nil { // the row that lists the parked rows
			parkedIDs, parkedKeys = ids, keys
			if limited != nil {
				res.Limited = int(*limited)
			}
			full = limitedTopics
			continue
		}
		c.ID, c.MessageID, c.Topic, c.RetryTimes, c.RedriveCount = *id, messageID.UUID, *topic, *retryTimes, *redrive
		c.CreatedAt, c.ClaimToken, c.LeaseUntil = *createdAt, token.UUID, *until
		if batch != nil {
			c.Batch, c.BatchAtClaim = *batch, *batch
		}
		res.Claimed = append(res.Claimed, c)
	}
	if err := rows.Err(); err != nil {
		return ClaimResult{}, fmt.Errorf("claim messages: %w", err)
	}
	res.Parked = len(parkedIDs) + res.Limited
	res.Waiting, res.Full = waiting > 0 || res.Limited > 0, full
	if err := s.parkFull(ctx, full, &res); err != nil {
		return res, err
	}
	if len(parkedIDs) > 0 {
		if err := s.recheckParked(ctx, parkedIDs, parkedKeys, rules); err != nil {
			return res, err
		}
	}
	return res, nil
}

// recheckParked settles the keys of the rows a claim just parked, once the parking has
// committed. It takes the park locks of the keys (in the order of the keys' hashes) and
// then, in new statements that see every release committed meanwhile: parks every other
// pending row of those keys that is held back (so a key with many waiting rows is parked
// in one statement, not a claim's worth at a time), and unparks the claim's rows that
// nothing holds back any more. The release trigger takes the same lock before it looks
// for parked rows, so a release that ran while the claim was parking is seen either here
// or by the trigger.
func (s *Store) recheckParked(ctx context.Context, ids []int64, keys []string, rules OrderingRules) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockKeysSQL, s.cfg.Schema+".outbox_messages.park", keys); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(parkKeysSQL, s.messages), append([]any{keys}, orderingArgs(rules)...)...); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(recheckParkedSQL, s.messages, s.pauses), append([]any{ids}, orderingArgs(rules)...)...)
		return err
	})
	if err != nil {
		return fmt.Errorf("look again at parked messages: %w", err)
	}
	return nil
}

// heldBack returns the condition, true for a row c that an earlier undelivered message of
// its key holds back under the ordering rules, whose orderingArgs are the
// statement's parameters $p to $p+4. The claim, the parking and the unparking share it.
// The subquery says e.ordering_key IS NOT NULL, which the join clause implies, so that
// the ordering index's predicate is proven where PostgreSQL turns the EXISTS into a
// semi-join (in parkKeysSQL); without it that statement scans the whole table.
func heldBack(p int) string {
	listed, unordered, defUnordered, skipping, defSkipping := p, p+1, p+2, p+3, p+4
	return fmt.Sprintf(`NOT (CASE WHEN c.topic = ANY($%[1]d) THEN c.topic = ANY($%[2]d) ELSE $%[3]d END)
    AND EXISTS (
      SELECT 1 FROM %%[1]s e
      WHERE e.ordering_key IS NOT NULL AND e.ordering_key = c.ordering_key AND e.ordering_seq < c.ordering_seq
        AND (e.status IN ('pending', 'claimed', 'dispatched')
          OR (e.status = 'dead' AND NOT (CASE WHEN e.topic = ANY($%[1]d) THEN e.topic = ANY($%[4]d) ELSE $%[5]d END))))`,
		listed, unordered, defUnordered, skipping, defSkipping)
}

var parkKeysSQL = `UPDATE %[1]s AS c SET held_back = true
WHERE c.ordering_key = ANY($1) AND c.status = 'pending' AND NOT c.held_back
  AND ` + heldBack(2)

var recheckParkedSQL = `UPDATE %[1]s AS c SET held_back = false
WHERE c.id = ANY($1) AND c.held_back
  AND NOT (` + heldBack(2) + `) AND NOT ` + paused

// unparkSQL unparks, for each key that has parked rows, its first parked row when nothing
// holds it back any more under the current rules (the same test as the claim's). It walks
// the keys with parked rows one index probe each (a skip scan), so it costs one probe per
// such key however many rows are parked behind it.
var unparkSQL = `WITH RECURSIVE keys(k) AS (
    (SELECT ordering_key FROM %[1]s WHERE held_back ORDER BY ordering_key LIMIT 1)
    UNION ALL
    SELECT (SELECT ordering_key FROM %[1]s WHERE held_back AND ordering_key > keys.k ORDER BY ordering_key LIMIT 1)
    FROM keys WHERE keys.k IS NOT NULL),
heads AS (
    SELECT h.* FROM keys, LATERAL (
        SELECT id, topic, ordering_key, ordering_seq FROM %[1]s
        WHERE held_back AND ordering_key = keys.k
        ORDER BY ordering_seq LIMIT 1) h
    WHERE keys.k IS NOT NULL)
UPDATE %[1]s AS m SET held_back = false
FROM heads c
WHERE m.id = c.id AND m.held_back
  AND NOT (` + heldBack(1) + `) AND NOT ` + paused

// unparkUnorderedSQL unparks the parked keyed rows of the topics whose ordering is off
// under the current rules (a topic set to ordering: false while its messages were parked
// behind an earlier one of their key), wherever they stand in their key, unless their
// topic is paused. unparkSQL looks at each key's first parked row only, which a blocked
// key's earlier rows of an ordered topic can keep from them for ever. It reads the parked
// rows (outbox_messages_held_back_idx) and runs only while a topic has ordering off.
var unparkUnorderedSQL = `UPDATE %[1]s AS c SET held_back = false
WHERE c.held_back AND c.ordering_key IS NOT NULL
  AND (CASE WHEN c.topic = ANY($1) THEN c.topic = ANY($2) ELSE $3 END)
  AND NOT ` + paused

// unparkLimitedSQL unparks parked rows without an ordering key of the topics that are not
// paused: for each such topic, oldest first, as many as the topic has room for under its
// limit (topicLimit, $1 to $3; its rows in flight counted as the claim counts them), or
// all of them when it has none. The claim parks a row without a key only for its topic's
// pause or its limit, so this releases a topic's backlog as its messages finish, and the
// rows a claim parked while their topic's resume ran. It walks the topics with such rows
// one index probe each (a skip scan of outbox_messages_parked_topic_idx), so it costs one
// probe per topic however many rows are parked. It returns the number of those topics
// and the number of rows it unparked.
var unparkLimitedSQL = `WITH RECURSIVE topics(t) AS (
    (SELECT topic FROM %[1]s WHERE held_back AND ordering_key IS NULL ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT topic FROM %[1]s WHERE held_back AND ordering_key IS NULL AND topic > topics.t ORDER BY topic LIMIT 1)
    FROM topics WHERE topics.t IS NOT NULL),
room AS MATERIALIZED (
    SELECT t, CASE WHEN lim > 0 THEN lim - (
        SELECT count(*) FROM %[1]s f
        WHERE f.topic = t AND f.status IN ('claimed', 'dispatched') AND ` + inFlight + `) END AS n
    FROM (SELECT t, ` + topicLimit("t", 1) + ` AS lim
          FROM topics WHERE t IS NOT NULL AND t <> ALL (ARRAY(SELECT topic FROM %[2]s))) l),
released AS MATERIALIZED (
    SELECT p.id FROM room, LATERAL (
        SELECT id FROM %[1]s
        WHERE held_back AND ordering_key IS NULL AND topic = room.t
        ORDER BY id LIMIT room.n) p
    WHERE room.n IS NULL OR room.n > 0),
unparked AS (
    UPDATE %[1]s AS m SET held_back = false
    WHERE m.id = ANY (ARRAY(SELECT id FROM released))
    RETURNING 1)
SELECT (SELECT count(*) FROM room), (SELECT count(*) FROM unparked)`

// parkFullSQL parks every other row due at once without a key of the topics $1, which a
// claim just found at their limit of messages in flight, so that the next claims find
// the rows of other topics committed after them at once rather than a claim's worth at
// a time. unparkLimitedSQL puts them back, oldest first, as the topics have room.
const parkFullSQL = `UPDATE %[1]s SET held_back = true
WHERE status = 'pending' AND next_retry_at IS NULL AND NOT held_back
  AND ordering_key IS NULL AND topic = ANY ($1)`

// parkFull runs parkFullSQL for topics, when there are any, and counts the rows it parked
// in res.
func (s *Store) parkFull(ctx context.Context, topics []string, res *ClaimResult) error {
	if len(topics) == 0 {
		return nil
	}
	tag, err := s.db.Exec(ctx, fmt.Sprintf(parkFullSQL, s.messages), topics)
	if err != nil {
		return fmt.Errorf("park the rows of topics at their limit: %w", err)
	}
	res.Limited += int(tag.RowsAffected())
	res.Parked += int(tag.RowsAffected())
	return nil
}

// anyParkedSQL tells whether any row without a key is parked (for a paused topic or for
// its topic's limit of messages in flight), from outbox_messages_parked_topic_idx.
const anyParkedSQL = `SELECT EXISTS (SELECT 1 FROM %[1]s WHERE held_back AND ordering_key IS NULL)`

// unparkLimited runs unparkLimitedSQL and returns the number of topics with such parked
// rows, and the number of rows it unparked. It first looks whether any row without a key
// is parked, as before most claims none is: that probe of outbox_messages_parked_topic_idx
// costs a fraction of planning and running the statement.
func (s *Store) unparkLimited(ctx context.Context, rules OrderingRules) (topics int, unparked int64, err error) {
	var parked bool
	err = s.db.QueryRow(ctx, fmt.Sprintf(anyParkedSQL, s.messages)).Scan(&parked)
	if err == nil && parked {
		err = s.db.QueryRow(ctx, fmt.Sprintf(unparkLimitedSQL, s.messages, s.pauses), limitArgs(rules)...).Scan(&topics, &unparked)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("unpark messages of topics below their limit: %w", err)
	}
	return topics, unparked, nil
}

// Unpark puts back on the claim's path the parked rows that nothing holds back any more
// (the first parked row of each key, and every parked row of a topic whose ordering is
// off): after a change of the topics' ordering settings, or when a parking raced the
// release of its key. The release trigger unparks a key's next
// row when a keyed message is sent, dead-lettered or discarded, so this is a safety net
// that the relays run now and then. It returns the number of rows unparked.
//
// It also unparks the rows without a key of topics that are not paused, as far as the
// topic's limit on messages in flight allows (see unparkLimitedSQL): rows a claim parked
// while their topic's resume ran (ResumeTopic unparks the others), and rows parked for
// the limit (ClaimBatch unparks those too, before it claims).
func (s *Store) Unpark(ctx context.Context, rules OrderingRules) (int64, error) {
	tag, err := s.db.Exec(ctx, fmt.Sprintf(unparkSQL, s.messages, s.pauses), orderingArgs(rules)...)
	if err != nil {
		return 0, fmt.Errorf("unpark held-back messages: %w", err)
	}
	n := tag.RowsAffected()
	if rules.DefaultUnordered || len(rules.Unordered) > 0 {
		args := orderingArgs(rules)
		tag, err := s.db.Exec(ctx, fmt.Sprintf(unparkUnorderedSQL, s.messages, s.pauses), args[0], args[1], args[2])
		if err != nil {
			return 0, fmt.Errorf("unpark held-back messages of topics with ordering off: %w", err)
		}
		n += tag.RowsAffected()
	}
	_, released, err := s.unparkLimited(ctx, rules)
	if err != nil {
		return 0, err
	}
	return n + released, nil
}

// exec runs a guarded UPDATE and reports whether it changed a row.
func (s *Store) exec(ctx context.Context, what, sql string, args ...any) (bool, error) {
	tag, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return tag.RowsAffected() > 0, nil
}

// MarkDispatchedAll records that workflows own the claimed rows: claimed → dispatched, in
// one statement, only for the rows whose claim the caller still holds (a row whose
// workflow already finished, or whose lease expired and another relay took it, has moved
// on). It returns the number of rows that were still claimed under their token and are
// now dispatched.
func (s *Store) MarkDispatchedAll(ctx context.Context, rows []Claimed) (int, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	ids := make([]int64, len(rows))
	tokens := make([]pgtype.UUID, len(rows)) // see binaryUUIDs
	batches := make([]string, len(rows))
	atClaim := make([]string, len(rows))
	for i, r := range rows {
		ids[i], tokens[i], batches[i], atClaim[i] = r.ID, binaryUUID(r.ClaimToken), r.Batch, r.BatchAtClaim
	}
	// A row whose batch_id changed since the claim was taken by a batch run meanwhile
	// (TakeForBatch): it is that batch's to send, not also this run's.
	tag, err := s.db.Exec(ctx, `UPDATE `+s.messages+` AS m
SET status = 'dispatched', claim_token = NULL, lease_until = NULL, dispatched_at = now(), updated_at = now(), held_back = false,
    batch_id = NULLIF(d.batch, '')
FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[]) AS d(id, token, batch, at_claim)
WHERE m.id = d.id AND m.status = 'claimed' AND m.claim_token = d.token
  AND (m.batch_id IS NULL OR m.batch_id = NULLIF(d.batch, '') OR m.batch_id = NULLIF(d.at_claim, ''))`, ids, tokens, batches, atClaim)
	if err != nil {
		return 0, fmt.Errorf("mark %d messages dispatched: %w", len(rows), err)
	}
	return int(tag.RowsAffected()), nil
}

// TakeForBatch records batch as the batch run of the rows of messages that are claimed and
// name this batch, or name no batch and are still held by the claim that handed them to
// it (BatchTake.ClaimToken; any claim when the token is unknown), or that are dispatched
// to this batch, and returns the message IDs of the rows that name it now: the ones that
// batch run may send. A row another batch holds, a row dispatched to a run of its own (no
// batch: a relay that met this batch's ID started before gave it one), a row claimed again
// since (the new claim hands it over, to a run that sends it), or a row that has moved on
// (sent, dead, pending again) is left alone. It changes no status.
func (s *Store) TakeForBatch(ctx context.Context, batch string, messages []BatchTake) ([]uuid.UUID, error) {
	if len(messages) == 0 {
		return nil, nil
	}
	ids := make([]pgtype.UUID, len(messages)) // see binaryUUIDs
	tokens := make([]pgtype.UUID, len(messages))
	for i, m := range messages {
		ids[i], tokens[i] = binaryUUID(m.MessageID), pgtype.UUID{Bytes: m.ClaimToken, Valid: m.ClaimToken != uuid.Nil}
	}
	rows, err := s.db.Query(ctx, `UPDATE `+s.messages+` AS m SET batch_id = $1
FROM unnest($2::uuid[], $3::uuid[]) AS t(message_id, token)
WHERE m.message_id = t.message_id
  AND (m.status = 'claimed' AND (m.batch_id = $1 OR m.batch_id IS NULL AND (t.token IS NULL OR m.claim_token = t.token))
       OR m.status = 'dispatched' AND m.batch_id = $1)
RETURNING m.message_id`, batch, ids, tokens)
	if err != nil {
		return nil, fmt.Errorf("take %d messages for batch %s: %w", len(messages), batch, err)
	}
	taken, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("take %d messages for batch %s: %w", len(messages), batch, err)
	}
	return taken, nil
}

// RetryClaimAfter leaves a claimed row claimed but ends its lease after d, so that a
// claim then (by this relay or another) takes it again soon instead of after the whole
// lease; only while the caller still holds the claim. ok is false when the row has moved
// on. The relay uses it for a row whose hand-over must wait a moment: the run that
// dead-lettered it before a redrive has not closed yet.
func (s *Store) RetryClaimAfter(ctx context.Context, id int64, token uuid.UUID, d time.Duration) (ok bool, err error) {
	return s.exec(ctx, "retry claim", `UPDATE `+s.messages+`
SET lease_until = now() + make_interval(secs => $3), updated_at = now()
WHERE id = $1 AND status = 'claimed' AND claim_token = $2`, id, token, d.Seconds())
}

// MarkSent records a delivered message: pending, claimed or dispatched → sent. ok is false
// when the row is already terminal or does not exist. It is RecordSent without the metrics.
func (s *Store) MarkSent(ctx context.Context, messageID uuid.UUID) (ok bool, err error) {
	sent, err := s.markSent(ctx, s.db, []uuid.UUID{messageID}, nil)
	return len(sent) > 0, err
}

// RecordSent is MarkSent returning what metrics need of the row it changed, in the same
// round trip; nil when the row is already terminal or does not exist.
func (s *Store) RecordSent(ctx context.Context, messageID uuid.UUID) (*Sent, error) {
	sent, err := s.markSent(ctx, s.db, []uuid.UUID{messageID}, nil)
	if len(sent) == 0 {
		return nil, err
	}
	return &sent[0], err
}

// RecordSentAll is RecordSent for many messages in one statement: the delivered messages
// of a batch run. It returns the rows it moved.
//
// The release trigger takes the park lock of each keyed row it moves, in the order the
// UPDATE moves them; so that two writers of several keys never deadlock, the statement's
// keys are locked first, in the order of their hashes, as the claim's recheck takes them.
func (s *Store) RecordSentAll(ctx context.Context, messageIDs []uuid.UUID) ([]Sent, error) {
	if len(messageIDs) == 0 {
		return nil, nil
	}
	if len(messageIDs) == 1 {
		return s.markSent(ctx, s.db, messageIDs, nil)
	}
	var sent []Sent
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(hashtext($1), h))
FROM (SELECT DISTINCT hashtext(ordering_key) AS h FROM `+s.messages+`
      WHERE message_id = ANY($2) AND ordering_key IS NOT NULL ORDER BY 1) AS keys`,
			s.cfg.Schema+".outbox_messages.park", binaryUUIDs(messageIDs)); err != nil {
			return fmt.Errorf("mark %d messages sent: lock their ordering keys: %w", len(messageIDs), err)
		}
		var err error
		sent, err = s.markSent(ctx, tx, messageIDs, nil)
		return err
	})
	return sent, err
}

// markSent is the one writer of → sent: pending, claimed or dispatched → sent, for the
// rows of messageIDs, in one statement run on db (the store's database, or a caller's
// transaction). With unchanged, the one row moves only while it is still the dispatched
// row unchanged was read from, not updated since (reconciliation's guard,
// stillDispatched). It returns what metrics need of the rows it moved.
func (s *Store) markSent(ctx context.Context, db DB, messageIDs []uuid.UUID, unchanged *Dispatched) ([]Sent, error) {
	guard, args := "", []any{binaryUUIDs(messageIDs)}
	if unchanged != nil {
		guard = " AND " + stillDispatched(2)
		args = append(args, unchanged.ID, unchanged.UpdatedAt)
	}
	rows, err := db.Query(ctx, `UPDATE `+s.messages+`
SET status = 'sent', sent_at = now(), claim_token = NULL, lease_until = NULL, updated_at = now(), held_back = false
WHERE message_id = ANY($1) AND status IN ('pending', 'claimed', 'dispatched')`+guard+`
RETURNING message_id, topic, sent_at - created_at`, args...)
	if err != nil {
		return nil, fmt.Errorf("mark %s sent: %w", messagesNoun(len(messageIDs)), err)
	}
	sent, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Sent, error) {
		var m Sent
		err := r.Scan(&m.MessageID, &m.Topic, &m.Latency)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("mark %s sent: %w", messagesNoun(len(messageIDs)), err)
	}
	return sent, nil
}

// messagesNoun is "message" or "n messages", for errors.
func messagesNoun(n int) string {
	if n == 1 {
		return "message"
	}
	return fmt.Sprintf("%d messages", n)
}

// RecordFailure records a failed delivery attempt on the row: retry_times becomes the
// number of failed attempts (it never decreases) and last_error the failure.
func (s *Store) RecordFailure(ctx context.Context, messageID uuid.UUID, failedAttempts int, lastError string) (ok bool, err error) {
	return s.exec(ctx, "record delivery failure", `UPDATE `+s.messages+`
SET retry_times = GREATEST(retry_times, $2), last_error = $3, updated_at = now()
WHERE message_id = $1 AND status IN ('pending', 'claimed', 'dispatched')`, messageID, failedAttempts, StorableText(lastError))
}

// selectRowsSQL reads rows as scanRow scans them, with whether their topic is paused;
// %[1]s is the messages table, %[2]s the pauses table.
const selectRowsSQL = `SELECT id, message_id, topic, payload, headers, status, retry_times, max_retry_times,
next_retry_at, last_error, redrive_count, created_at, updated_at, sent_at, ordering_key, ordering_seq, batch_id, held_back,
topic = ANY (ARRAY(SELECT topic FROM %[2]s)) FROM %[1]s`

func scanRow(r pgx.Row) (Row, error) {
	var m Row
	var payload, headers []byte
	err := r.Scan(&m.ID, &m.MessageID, &m.Topic, &payload, &headers, &m.Status, &m.RetryTimes,
		&m.MaxRetryTimes, &m.NextRetryAt, &m.LastError, &m.RedriveCount, &m.CreatedAt, &m.UpdatedAt, &m.SentAt,
		&m.OrderingKey, &m.OrderingSeq, &m.BatchID, &m.HeldBack, &m.Paused)
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
	m, err := scanRow(s.db.QueryRow(ctx, s.selectRows+` WHERE message_id = $1`, messageID))
	if err != nil {
		return m, fmt.Errorf("load message %s: %w", messageID, err)
	}
	return m, nil
}

// GetAll loads the messages of messageIDs, by message ID, in one statement. An ID
// without a row is left out.
func (s *Store) GetAll(ctx context.Context, messageIDs []uuid.UUID) (map[uuid.UUID]Row, error) {
	rows, err := s.db.Query(ctx, s.selectRows+` WHERE message_id = ANY($1)`, binaryUUIDs(messageIDs))
	if err != nil {
		return nil, fmt.Errorf("load %d messages: %w", len(messageIDs), err)
	}
	defer rows.Close()
	out := make(map[uuid.UUID]Row, len(messageIDs))
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
// and moves the row to dead, in one transaction. Dead letters are keyed by (message ID, run
// ID): a run dead-letters its message once, and a second call for the same run (a retried
// or replayed dead-letter step) changes nothing and succeeds, even when the dead letter
// has been redriven or discarded meanwhile, so it never undoes an operator's action. Only
// another run (one that gave up after a redrive) dead-letters the message again. A row
// that is already sent or discarded is left alone and gets no dead letter; ok reports
// whether the row moved to dead.
func (s *Store) DeadLetter(ctx context.Context, d DeadLetter) (ok bool, err error) {
	d.LastError = StorableText(d.LastError)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var status Status
		var createdAt *time.Time
		// The JSON goes back as text: a []byte would go as bytea under the simple protocol
		// or QueryExecModeExec, and a jsonb parameter refuses that.
		topic, payload, headers := d.Topic, "null", (*string)(nil)
		err := tx.QueryRow(ctx, `SELECT status, topic, payload::text, headers::text, created_at FROM `+s.messages+`
WHERE message_id = $1 FOR UPDATE`, d.MessageID).Scan(&status, &topic, &payload, &headers, &createdAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			status = ""
		case err != nil:
			return err
		case status == StatusSent || status == StatusDiscarded:
			return nil
		}
		tag, err := tx.Exec(ctx, `INSERT INTO `+s.dead+`
(message_id, workflow_id, run_id, topic, payload, headers, attempts, last_error, message_created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (message_id, run_id) DO NOTHING`,
			d.MessageID, d.WorkflowID, d.RunID, topic, payload, headers, d.Attempts, d.LastError, createdAt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			// This run dead-lettered the message already, and that moved the row to dead
			// in the same transaction. Whatever happened to the row since (a redrive, a
			// discard, a new hand-over) came later and stands.
			return nil
		}
		tag, err = tx.Exec(ctx, `UPDATE `+s.messages+`
SET status = 'dead', last_error = $2, claim_token = NULL, lease_until = NULL, updated_at = now(), held_back = false
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
