package mysqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

// The claim reads outbox_messages_claim_idx: lane 2 (delayed rows, in next_retry_at order
// up to now) and then lane 1 (rows due at once, in id order), each stopping at the limit,
// so it costs the same however many sent, delayed or held-back rows the table keeps. SKIP
// LOCKED lets concurrent relays take disjoint batches. The statements name claim_lane
// with the conditions it stands for, which the index has.
const (
	claimDelayedSQL = `SELECT id, ordering_key, topic, topic IN (SELECT topic FROM %[2]s) FROM %[1]s
WHERE claim_lane = 2 AND next_retry_at <= NOW(6)
  AND (status = 'pending' OR lease_until <= NOW(6))
ORDER BY next_retry_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED`

	claimImmediateSQL = `SELECT id, ordering_key, topic, topic IN (SELECT topic FROM %[2]s) FROM %[1]s
WHERE claim_lane = 1 AND next_retry_at IS NULL
  AND (status = 'pending' OR lease_until <= NOW(6))
ORDER BY id
LIMIT ?
FOR UPDATE SKIP LOCKED`
)

// heldBack writes the condition, true for a row c that an earlier undelivered message of
// its key holds back under the ordering rules (pending, claimed, dispatched, or dead
// where the dead message's topic blocks its key; topics with ordering off are never held
// back), or whose topic is paused. The claim, the parking, the recheck and the sweep
// share it, as in package store.
func (s *Store) heldBack(q *sqlBuilder, rules storedriver.OrderingRules) {
	q.sql("(c.topic IN (SELECT topic FROM " + s.pauses + ") OR ")
	q.sql("(c.ordering_key IS NOT NULL AND NOT (CASE WHEN ").in("c.topic", rules.Listed).
		sql(" THEN ").in("c.topic", rules.Unordered).
		sql(" ELSE " + boolSQL(rules.DefaultUnordered) + " END)")
	q.sql(` AND EXISTS (SELECT 1 FROM `+s.messages+` e
    WHERE e.ordering_key = c.ordering_key AND e.ordering_seq < c.ordering_seq
      AND (e.status IN ('pending', 'claimed', 'dispatched')
        OR (e.status = 'dead' AND NOT (CASE WHEN `).in("e.topic", rules.Listed).
		sql(" THEN ").in("e.topic", rules.Skipping).
		sql(" ELSE " + boolSQL(rules.DefaultSkipping) + " END))))))")
}

// heldBackAmong returns those of ids that are held back (see heldBack), with their
// ordering keys ("" for a row without one), in a statement that sees what committed
// before it (a consistent read: it locks nothing).
func (s *Store) heldBackAmong(ctx context.Context, tx *sql.Tx, ids []int64, rules storedriver.OrderingRules) (map[int64]string, error) {
	out := map[int64]string{}
	if len(ids) == 0 {
		return out, nil
	}
	q := (&sqlBuilder{}).sql(`SELECT c.id, c.ordering_key FROM ` + s.messages + ` c WHERE c.id IN (` + idList(ids) + `) AND `)
	s.heldBack(q, rules)
	rows, err := tx.QueryContext(ctx, q.String(), q.args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var key sql.NullString
		if err := rows.Scan(&id, &key); err != nil {
			return nil, err
		}
		out[id] = key.String
	}
	return out, rows.Err()
}

// queryIDs runs a SELECT of ids (a locking one or not) and returns them in its order.
func queryIDs(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]int64, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// ClaimBatch takes up to limit due rows (pending rows whose next_retry_at has passed or is
// unset, and claimed rows whose lease has expired; delayed rows first, then the others by
// id) and leases them for lease under a new claim token, as package store does. A keyed
// row that an earlier undelivered message of its key holds back (see OrderingRules), and
// a row of a paused topic, is parked instead (held_back), which takes it off the claim's
// index until its key is released or its topic resumed; Parked counts those. Under
// rules' limits of messages in flight, the rows of a topic beyond its room are parked
// too, and then the topic's other due rows (parkFull); unparkLimited, which runs first,
// puts them back as the topic has room.
//
// It is one READ COMMITTED transaction: the due rows are selected FOR UPDATE SKIP LOCKED,
// the held-back ones found with a consistent read, both groups updated by id, and the
// claimed rows read back before the commit. All times are the database clock's. After
// the commit the keys of the parked rows are looked at again under their park locks (see
// recheckParked).
func (s *Store) ClaimBatch(ctx context.Context, limit int, lease time.Duration, rules storedriver.OrderingRules) (storedriver.ClaimResult, error) {
	if limit < 1 {
		return storedriver.ClaimResult{}, fmt.Errorf("claim limit must be at least 1, got %d", limit)
	}
	token, err := uuid.NewRandom()
	if err != nil {
		return storedriver.ClaimResult{}, fmt.Errorf("new claim token: %w", err)
	}
	var waiting int
	if rules.LimitsInFlight() {
		if waiting, _, err = s.unparkLimited(ctx, rules); err != nil {
			return storedriver.ClaimResult{}, err
		}
	}
	var (
		res        storedriver.ClaimResult
		parkedIDs  []int64
		parkedKeys []string
		full       []string // the topics the claim found at their limit
	)
	delayedSQL, immediateSQL := fmt.Sprintf(claimDelayedSQL, s.messages, s.pauses), fmt.Sprintf(claimImmediateSQL, s.messages, s.pauses)
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		res, parkedIDs, parkedKeys, full = storedriver.ClaimResult{}, nil, nil, nil
		var ids, keyed []int64
		paused := map[int64]string{} // rows of paused topics, with their keys
		var unkeyed []limitCandidate // the others without a key
		choose := func(query string, n int) error {
			rows, err := tx.QueryContext(ctx, query, n)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				var key sql.NullString
				var topic string
				var topicPaused bool
				if err := rows.Scan(&id, &key, &topic, &topicPaused); err != nil {
					return err
				}
				ids = append(ids, id)
				switch {
				case topicPaused:
					paused[id] = key.String
				case key.Valid:
					keyed = append(keyed, id)
				default:
					unkeyed = append(unkeyed, limitCandidate{id, topic})
				}
			}
			return rows.Err()
		}
		if err := choose(delayedSQL, limit); err != nil {
			return err
		}
		if len(ids) < limit {
			if err := choose(immediateSQL, limit-len(ids)); err != nil {
				return err
			}
		}
		if len(ids) == 0 {
			return nil
		}
		blocked, err := s.heldBackAmong(ctx, tx, keyed, rules)
		if err != nil {
			return err
		}
		maps.Copy(blocked, paused)
		limited, err := s.overLimit(ctx, tx, unkeyed, rules)
		if err != nil {
			return err
		}
		var claim, park []int64
		keySeen := map[string]bool{}
		for _, id := range ids {
			if topic, ok := limited[id]; ok {
				park = append(park, id)
				res.Limited++
				if !slices.Contains(full, topic) {
					full = append(full, topic)
				}
				continue
			}
			if key, ok := blocked[id]; ok {
				parkedIDs = append(parkedIDs, id)
				if key != "" && !keySeen[key] {
					keySeen[key] = true
					parkedKeys = append(parkedKeys, key)
				}
				continue
			}
			claim = append(claim, id)
		}
		if park = append(park, parkedIDs...); len(park) > 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET held_back = TRUE WHERE id IN (`+idList(park)+`)`); err != nil {
				return err
			}
		}
		if len(claim) == 0 {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.messages+`
SET status = 'claimed', claim_token = ?, lease_until = NOW(6) + INTERVAL ? MICROSECOND, updated_at = NOW(6)
WHERE id IN (`+idList(claim)+`)`, token.String(), micros(lease)); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, message_id, topic, retry_times, max_retry_times, redrive_count,
  created_at, dispatched_at, claim_token, lease_until, COALESCE(batch_id, '')
FROM `+s.messages+` WHERE id IN (`+idList(claim)+`)`)
		if err != nil {
			return err
		}
		defer rows.Close()
		byID := make(map[int64]storedriver.Claimed, len(claim))
		for rows.Next() {
			var c storedriver.Claimed
			if err := rows.Scan(&c.ID, &c.MessageID, &c.Topic, &c.RetryTimes, &c.MaxRetryTimes, &c.RedriveCount,
				&c.CreatedAt, &c.DispatchedAt, &c.ClaimToken, &c.LeaseUntil, &c.Batch); err != nil {
				return err
			}
			c.BatchAtClaim = c.Batch
			byID[c.ID] = c
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range claim {
			if c, ok := byID[id]; ok {
				res.Claimed = append(res.Claimed, c)
			}
		}
		return nil
	})
	if err != nil {
		return storedriver.ClaimResult{}, fmt.Errorf("claim messages: %w", err)
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

// lockParks takes the park locks of keys, in the keys' byte order, until tx ends: it
// upserts their rows of outbox_ordering_parks, which locks them.
func (s *Store) lockParks(ctx context.Context, tx *sql.Tx, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var b strings.Builder
	args := make([]any, len(keys))
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?)")
		args[i] = k
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO `+s.parks+` (ordering_key) VALUES `+b.String()+`
ON DUPLICATE KEY UPDATE ordering_key = ordering_key`, args...)
	return err
}

// recheckParked settles the keys of the rows a claim just parked, once the parking has
// committed, as package store does. It takes the park locks of the keys and then, in new
// statements that see every release committed meanwhile: parks every other pending row of
// those keys that is held back (so a key with many waiting rows is parked at once, not a
// claim's worth at a time), and unparks the claim's rows that nothing holds back any more.
// A release (a keyed message sent, dead-lettered or discarded) takes the same lock before
// it looks for parked rows, so a release that ran while the claim was parking is seen
// either here or by the release. Rows are locked with SKIP LOCKED: this transaction never
// waits for a row while it holds park locks, so it cannot deadlock with a release (which
// holds its row and waits for the park lock).
func (s *Store) recheckParked(ctx context.Context, ids []int64, keys []string, rules storedriver.OrderingRules) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.lockParks(ctx, tx, keys); err != nil {
			return err
		}
		// The pending rows of the keys, found with a consistent read and then locked by
		// their primary key only (see lockByID).
		var pending []int64
		if len(keys) > 0 {
			q := (&sqlBuilder{}).sql(`SELECT id FROM `+s.messages+` WHERE `).in("ordering_key", keys).
				sql(` AND status = 'pending' AND held_back = FALSE`)
			var err error
			if pending, err = queryIDs(ctx, tx, q.String(), q.args...); err != nil {
				return err
			}
		}
		var err error
		if pending, err = s.lockByID(ctx, tx, pending, `status = 'pending' AND held_back = FALSE`); err != nil {
			return err
		}
		held, err := s.heldBackAmong(ctx, tx, pending, rules)
		if err != nil {
			return err
		}
		if len(held) > 0 {
			park := make([]int64, 0, len(held))
			for id := range held {
				park = append(park, id)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET held_back = TRUE
WHERE id IN (`+idList(park)+`) AND status = 'pending' AND held_back = FALSE`); err != nil {
				return err
			}
		}
		_, err = s.unparkFree(ctx, tx, ids, rules)
		return err
	})
	if err != nil {
		return fmt.Errorf("look again at parked messages: %w", err)
	}
	return nil
}

// lockByID locks those of ids whose rows still meet cond, skipping rows other transactions
// hold, and returns them. It reads the primary key only: a SKIP LOCKED scan of a
// secondary index keeps its lock on the index entry of each row it skips, which would
// make the transaction that holds that row wait for this one when it changes the entry,
// and the two deadlock if this one then changes an entry of that index the other skipped.
func (s *Store) lockByID(ctx context.Context, tx *sql.Tx, ids []int64, cond string) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return queryIDs(ctx, tx, `SELECT id FROM `+s.messages+` FORCE INDEX (PRIMARY)
WHERE id IN (`+idList(ids)+`) AND `+cond+`
FOR UPDATE SKIP LOCKED`)
}

// unparkFree unparks those of ids that are parked and that nothing holds back, skipping
// rows other transactions hold, and returns how many it unparked.
func (s *Store) unparkFree(ctx context.Context, tx *sql.Tx, ids []int64, rules storedriver.OrderingRules) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	parked, err := s.lockByID(ctx, tx, ids, `held_back = TRUE`)
	if err != nil {
		return 0, err
	}
	held, err := s.heldBackAmong(ctx, tx, parked, rules)
	if err != nil {
		return 0, err
	}
	free := slices.DeleteFunc(parked, func(id int64) bool { _, ok := held[id]; return ok })
	if len(free) == 0 {
		return 0, nil
	}
	res, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET held_back = FALSE WHERE id IN (`+idList(free)+`) AND held_back = TRUE`)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// release is the release trigger of package store: when a keyed message has been sent,
// dead-lettered or discarded, the next parked message of its key may be due. In tx (which
// moved the row), it takes the key's park lock and unparks the key's first parked row;
// the claim decides again whether it is held back.
func (s *Store) release(ctx context.Context, tx *sql.Tx, key string) error {
	if err := s.lockParks(ctx, tx, []string{key}); err != nil {
		return fmt.Errorf("release ordering key %q: %w", key, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET held_back = FALSE
WHERE held_back = TRUE AND ordering_key = ?
ORDER BY ordering_seq
LIMIT 1`, key); err != nil {
		return fmt.Errorf("release ordering key %q: %w", key, err)
	}
	return nil
}

// unparkHeadsSQL finds, for each key that has parked rows, its first parked row: the
// GROUP BY names a leftmost prefix of outbox_messages_held_back_idx and MIN its next
// column, so it reads the index one probe per key (a loose index scan, "Using index for
// group-by"), however many rows are parked behind it.
const unparkHeadsSQL = `SELECT h.id FROM (
    SELECT ordering_key, MIN(ordering_seq) AS seq FROM %[1]s
    WHERE held_back = TRUE GROUP BY held_back, ordering_key) k
JOIN %[1]s h ON h.held_back = TRUE AND h.ordering_key = k.ordering_key AND h.ordering_seq = k.seq`

// Unpark puts back on the claim's path the parked rows that nothing holds back any more
// (the first parked row of each key, and every parked row of a topic whose ordering is
// off): after a change of the topics' ordering settings, a row moved to sent, dead or
// discarded by hand, or a release that a crash cut short. The
// store's own transitions release a key's next row when a keyed message is sent,
// dead-lettered or discarded, so this is a safety net that the relays run now and then. It
// returns the number of rows unparked.
//
// It also unparks the rows without an ordering key whose topic is not paused: the claim
// parks such a row only for its topic's pause, so a claim that raced the resume parked it
// (ResumeTopic unparks the others).
func (s *Store) Unpark(ctx context.Context, rules storedriver.OrderingRules) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		heads, err := queryIDs(ctx, tx, fmt.Sprintf(unparkHeadsSQL, s.messages))
		if err != nil {
			return err
		}
		if rules.DefaultUnordered || len(rules.Unordered) > 0 {
			// The parked keyed rows of the topics whose ordering is off, wherever they
			// stand in their key: a blocked key's first parked row of an ordered topic
			// would keep them for ever.
			q := (&sqlBuilder{}).sql(`SELECT c.id FROM `+s.messages+` c
WHERE c.held_back = TRUE AND c.ordering_key IS NOT NULL AND (CASE WHEN `).in("c.topic", rules.Listed).
				sql(" THEN ").in("c.topic", rules.Unordered).
				sql(" ELSE " + boolSQL(rules.DefaultUnordered) + " END)")
			unordered, err := queryIDs(ctx, tx, q.String(), q.args...)
			if err != nil {
				return err
			}
			seen := make(map[int64]bool, len(heads))
			for _, id := range heads {
				seen[id] = true
			}
			for _, id := range unordered {
				if !seen[id] {
					heads = append(heads, id)
				}
			}
		}
		n, err = s.unparkFree(ctx, tx, heads, rules)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("unpark held-back messages: %w", err)
	}
	_, released, err := s.unparkLimited(ctx, rules)
	return n + released, err
}

// limitCandidate is a row without an ordering key that a claim chose, of a topic that is
// not paused.
type limitCandidate struct {
	id    int64
	topic string
}

// inFlight returns the rows in flight of topics, by topic (topics without any are left
// out): dispatched, or claimed under a lease that has not run out (a claimed row whose
// lease ran out waits for the next claim, and a parked one for its release), as package
// store counts them. It reads the rows of those statuses (outbox_messages_updated_idx).
func (s *Store) inFlight(ctx context.Context, tx *sql.Tx, topics []string) (map[string]int, error) {
	out := map[string]int{}
	if len(topics) == 0 {
		return out, nil
	}
	q := (&sqlBuilder{}).sql(`SELECT topic, COUNT(*) FROM `+s.messages+`
WHERE status IN ('claimed', 'dispatched') AND `).in("topic", topics).sql(`
  AND (status = 'dispatched' OR (lease_until > NOW(6) AND held_back = FALSE))
GROUP BY topic`)
	rows, err := tx.QueryContext(ctx, q.String(), q.args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		var n int
		if err := rows.Scan(&topic, &n); err != nil {
			return nil, err
		}
		out[topic] = n
	}
	return out, rows.Err()
}

// overLimit returns those of rows (a claim's rows without a key, of topics that are not
// paused) beyond their topic's limit of messages in flight, with their topics: the
// topic's rows in flight and the claim's rows of the topic before them, in id order,
// count against it (rules.InFlightLimit).
func (s *Store) overLimit(ctx context.Context, tx *sql.Tx, rows []limitCandidate, rules storedriver.OrderingRules) (map[int64]string, error) {
	over := map[int64]string{}
	var topics []string
	for _, r := range rows {
		if rules.InFlightLimit(r.topic) > 0 && !slices.Contains(topics, r.topic) {
			topics = append(topics, r.topic)
		}
	}
	if len(topics) == 0 {
		return over, nil
	}
	used, err := s.inFlight(ctx, tx, topics)
	if err != nil {
		return nil, err
	}
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b limitCandidate) int { return cmp.Compare(a.id, b.id) })
	for _, r := range rows {
		limit := rules.InFlightLimit(r.topic)
		if limit == 0 {
			continue
		}
		if used[r.topic] >= limit {
			over[r.id] = r.topic
			continue
		}
		used[r.topic]++
	}
	return over, nil
}

// parkFull parks every other row due at once without a key of topics, which a claim just
// found at their limit of messages in flight, so that the next claims find the rows of
// other topics committed after them at once rather than a claim's worth at a time;
// unparkLimited puts them back, oldest first, as the topics have room. The rows are found
// with a consistent read of the claim's lane 1 and locked by their primary key only,
// skipping rows a claim holds (see lockByID). It counts the rows it parked in res.
func (s *Store) parkFull(ctx context.Context, topics []string, res *storedriver.ClaimResult) error {
	if len(topics) == 0 {
		return nil
	}
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		q := (&sqlBuilder{}).sql(`SELECT id FROM `+s.messages+`
WHERE claim_lane = 1 AND next_retry_at IS NULL AND status = 'pending' AND ordering_key IS NULL AND `).in("topic", topics)
		ids, err := queryIDs(ctx, tx, q.String(), q.args...)
		if err != nil {
			return err
		}
		const cond = `status = 'pending' AND held_back = FALSE AND ordering_key IS NULL`
		if ids, err = s.lockByID(ctx, tx, ids, cond); err != nil || len(ids) == 0 {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET held_back = TRUE WHERE id IN (`+idList(ids)+`) AND `+cond)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("park the rows of topics at their limit: %w", err)
	}
	res.Limited += int(n)
	res.Parked += int(n)
	return nil
}

// Statements of unparkLimited. The parked rows without a key sit in
// outbox_messages_held_back_idx by topic and then id (their ordering_seq is NULL: the
// insert trigger sets it only for a row with a key), so parkedTopicsSQL reads one entry
// per topic (a loose index scan) and parkedOfTopicSQL a topic's oldest rows in one range.
const (
	parkedTopicsSQL = `SELECT topic FROM %[1]s
WHERE held_back = TRUE AND ordering_key IS NULL AND ordering_seq IS NULL
  AND topic NOT IN (SELECT topic FROM %[2]s)
GROUP BY held_back, ordering_key, ordering_seq, topic`
	parkedOfTopicSQL = `SELECT id FROM %[1]s
WHERE held_back = TRUE AND ordering_key IS NULL AND ordering_seq IS NULL AND topic = ?
ORDER BY id
LIMIT ?`
)

// parkedTopics lists the topics, not paused, with parked rows without an ordering key
// (parkedTopicsSQL).
func (s *Store) parkedTopics(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, fmt.Sprintf(parkedTopicsSQL, s.messages, s.pauses))
	if err != nil {
		return nil, fmt.Errorf("unpark messages of topics below their limit: %w", err)
	}
	defer rows.Close()
	var topics []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("unpark messages of topics below their limit: %w", err)
		}
		topics = append(topics, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("unpark messages of topics below their limit: %w", err)
	}
	return topics, nil
}

// unparkLimited unparks parked rows without an ordering key of the topics that are not
// paused: for each such topic, oldest first, as many as the topic has room for under its
// limit (rules.InFlightLimit; its rows in flight counted as the claim counts them), or
// up to 10,000 when it has none. The claim parks a row without a key only for its topic's
// pause or its limit, so this releases a topic's backlog as its messages finish, and the
// rows a claim parked while their topic's resume ran. It returns the number of topics
// with such rows, and the number of rows it unparked.
func (s *Store) unparkLimited(ctx context.Context, rules storedriver.OrderingRules) (waiting int, unparked int64, err error) {
	// The topics first, outside a transaction: before most claims there are none, and the
	// claim then pays one index probe, not a transaction.
	topics, err := s.parkedTopics(ctx)
	if err != nil || len(topics) == 0 {
		return 0, 0, err
	}
	var n int64
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		n = 0
		var limited []string
		for _, t := range topics {
			if rules.InFlightLimit(t) > 0 {
				limited = append(limited, t)
			}
		}
		used, err := s.inFlight(ctx, tx, limited)
		if err != nil {
			return err
		}
		for _, t := range topics {
			room := 10000
			if limit := rules.InFlightLimit(t); limit > 0 {
				room = limit - used[t]
			}
			if room <= 0 {
				continue
			}
			ids, err := queryIDs(ctx, tx, fmt.Sprintf(parkedOfTopicSQL, s.messages), t, room)
			if err != nil {
				return err
			}
			if ids, err = s.lockByID(ctx, tx, ids, `held_back = TRUE`); err != nil {
				return err
			}
			if len(ids) == 0 {
				// Unparked meanwhile, or locked by another transaction: the next topics
				// still get their turn.
				continue
			}
			res, err := tx.ExecContext(ctx, `UPDATE `+s.messages+` SET held_back = FALSE WHERE id IN (`+idList(ids)+`) AND held_back = TRUE`)
			if err != nil {
				return err
			}
			m, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += m
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("unpark messages of topics below their limit: %w", err)
	}
	return len(topics), n, nil
}

// nextDueSQL is the earliest "deliver not before" time still ahead, as a wait in
// microseconds from the database clock's now, read from the claim's index with one probe:
// lane 2 holds the delayed rows in next_retry_at order (a claimed row's time has passed).
const nextDueSQL = `SELECT TIMESTAMPDIFF(MICROSECOND, NOW(6), MIN(next_retry_at))
FROM %s
WHERE claim_lane = 2 AND next_retry_at > NOW(6)`

// NextDue reports how long it is until the earliest pending message whose next_retry_at
// is still ahead falls due, by the database clock; ok is false when there is no such
// message. Messages already due are not counted: the claim takes them; nor are parked
// ones, which only their key's release makes claimable.
func (s *Store) NextDue(ctx context.Context) (wait time.Duration, ok bool, err error) {
	var us sql.NullInt64
	if err := s.db.QueryRowContext(ctx, fmt.Sprintf(nextDueSQL, s.messages)).Scan(&us); err != nil {
		return 0, false, fmt.Errorf("find next due message: %w", err)
	}
	if !us.Valid {
		return 0, false, nil
	}
	return time.Duration(us.Int64) * time.Microsecond, true, nil
}

// MarkDispatchedAll records that workflows own the claimed rows: claimed → dispatched, in
// one statement, only for the rows whose claim the caller still holds. It returns the
// number of rows that were still claimed under their token and are now dispatched.
func (s *Store) MarkDispatchedAll(ctx context.Context, rows []storedriver.Claimed) (int, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	ids := make([]int64, len(rows))
	var pairs, batches, kept strings.Builder
	var args, keptArgs []any
	for i, r := range rows {
		ids[i] = r.ID
		if i > 0 {
			pairs.WriteString(", ")
		}
		fmt.Fprintf(&pairs, "(%d, '%s')", r.ID, r.ClaimToken)
		if r.Batch != "" {
			fmt.Fprintf(&batches, " WHEN %d THEN ?", r.ID)
			args = append(args, r.Batch)
		}
		for _, b := range []string{r.Batch, r.BatchAtClaim} {
			if b != "" {
				if kept.Len() > 0 {
					kept.WriteString(", ")
				}
				fmt.Fprintf(&kept, "(%d, ?)", r.ID)
				keptArgs = append(keptArgs, b)
			}
		}
	}
	batch := "NULL"
	if batches.Len() > 0 {
		batch = "CASE id" + batches.String() + " END"
	}
	// A row whose batch_id changed since the claim was taken by a batch run meanwhile
	// (TakeForBatch): it is that batch's to send, not also this run's. A row may name no
	// batch, the one this call records, or the one the claim read.
	allowed := "batch_id IS NULL"
	if kept.Len() > 0 {
		allowed = "(batch_id IS NULL OR (id, batch_id) IN (" + kept.String() + "))"
	}
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.messages+`
SET status = 'dispatched', claim_token = NULL, lease_until = NULL, dispatched_at = NOW(6), updated_at = NOW(6), held_back = FALSE,
    batch_id = `+batch+`
WHERE id IN (`+idList(ids)+`) AND status = 'claimed' AND (id, claim_token) IN (`+pairs.String()+`) AND `+allowed, append(args, keptArgs...)...)
	if err != nil {
		return 0, fmt.Errorf("mark %d messages dispatched: %w", len(rows), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("mark %d messages dispatched: %w", len(rows), err)
	}
	return int(n), nil
}

// TakeForBatch records batch as the batch run of the rows of messages that are claimed and
// name this batch, or name no batch and are still held by the claim that handed them to
// it (BatchTake.ClaimToken; any claim when the token is unknown), or that are dispatched
// to this batch, and returns the message IDs of the rows that name it now: the ones that
// batch run may send. A row another batch holds, a row dispatched to a run of its own, a
// row claimed again since (the new claim hands it over), or a row that has moved on is
// left alone. It changes no status.
func (s *Store) TakeForBatch(ctx context.Context, batch string, messages []storedriver.BatchTake) ([]uuid.UUID, error) {
	if len(messages) == 0 {
		return nil, nil
	}
	messageIDs := make([]uuid.UUID, len(messages))
	var (
		held     []string    // ('message_id', 'claim_token') of the messages whose claim is known
		anyClaim []uuid.UUID // the others'
	)
	for i, m := range messages {
		messageIDs[i] = m.MessageID
		if m.ClaimToken == uuid.Nil {
			anyClaim = append(anyClaim, m.MessageID)
		} else {
			held = append(held, fmt.Sprintf("('%s', '%s')", m.MessageID, m.ClaimToken))
		}
	}
	var claimedBy []string
	if len(held) > 0 {
		claimedBy = append(claimedBy, "(message_id, claim_token) IN ("+strings.Join(held, ", ")+")")
	}
	if len(anyClaim) > 0 {
		claimedBy = append(claimedBy, "message_id IN ("+uuidList(anyClaim)+")")
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE `+s.messages+` SET batch_id = ?
WHERE message_id IN (`+uuidList(messageIDs)+`)
  AND (status = 'claimed' AND (batch_id = ? OR batch_id IS NULL AND (`+strings.Join(claimedBy, " OR ")+`))
       OR status = 'dispatched' AND batch_id = ?)`,
		batch, batch, batch); err != nil {
		return nil, fmt.Errorf("take %d messages for batch %s: %w", len(messageIDs), batch, err)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT message_id FROM `+s.messages+`
WHERE message_id IN (`+uuidList(messageIDs)+`) AND status IN ('claimed', 'dispatched') AND batch_id = ?`, batch)
	if err != nil {
		return nil, fmt.Errorf("take %d messages for batch %s: %w", len(messageIDs), batch, err)
	}
	defer rows.Close()
	var taken []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("take %d messages for batch %s: %w", len(messageIDs), batch, err)
		}
		taken = append(taken, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("take %d messages for batch %s: %w", len(messageIDs), batch, err)
	}
	return taken, nil
}

// RetryClaimAfter leaves a claimed row claimed but ends its lease after d, so that a claim
// then takes it again soon instead of after the whole lease; only while the caller still
// holds the claim. ok is false when the row has moved on.
func (s *Store) RetryClaimAfter(ctx context.Context, id int64, token uuid.UUID, d time.Duration) (ok bool, err error) {
	return s.exec(ctx, "retry claim", `UPDATE `+s.messages+`
SET lease_until = NOW(6) + INTERVAL ? MICROSECOND, updated_at = NOW(6)
WHERE id = ? AND status = 'claimed' AND claim_token = ?`, micros(d), id, token.String())
}
