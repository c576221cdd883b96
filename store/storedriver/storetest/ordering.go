package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testOrdering pins per-key ordering: the messages of an ordering key are handed over one
// at a time, in the order of the sequence numbers the store gave them (commit order),
// whatever the concurrency of their writers; a dead message blocks its key unless its
// topic skips dead messages; unordered topics are never held back; and a held-back row
// becomes claimable as soon as the message before it is sent.
func testOrdering(t *testing.T, h Harness) {
	t.Run("ConcurrentWritersOneKeyAtATimeInSequenceOrder", func(t *testing.T) { orderingUnderConcurrentWriters(t, h) })

	// The second of a key stays behind the first while that is in flight, and is
	// claimable the moment the first is sent (no sweep needed); Unpark never releases a
	// row that is still held back.
	t.Run("HeldBackUntilTheEarlierIsSent", func(t *testing.T) {
		e := newEnv(t, h)
		res := e.enqueue(keyed("order.event", "order-1", 1), keyed("order.event", "order-1", 2), keyed("order.event", "order-1", 3))
		require.Positive(t, res[0].OrderingSeq)
		require.Less(t, res[0].OrderingSeq, res[1].OrderingSeq)
		require.Less(t, res[1].OrderingSeq, res[2].OrderingSeq)
		first, second, third := res[0].MessageID, res[1].MessageID, res[2].MessageID
		row := e.get(second)
		require.NotNil(t, row.OrderingKey)
		require.Equal(t, "order-1", *row.OrderingKey)
		require.NotNil(t, row.OrderingSeq)
		require.Equal(t, res[1].OrderingSeq, *row.OrderingSeq)

		c := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1)
		require.Equal(t, first, c.Claimed[0].MessageID)
		require.Equal(t, 2, c.Parked, "the claim reports the rows it found held back")
		require.True(t, e.get(third).HeldBack, "Get says the row is held back")
		require.False(t, e.get(first).HeldBack)
		e.dispatch(c.Claimed...)
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed, "nothing of the key while the first is in flight")
		_, err := e.d().Unpark(e.ctx, storedriver.OrderingRules{})
		require.NoError(t, err)
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed, "Unpark releases nothing still held back")
		st, err := e.d().Stats(e.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, st.HeldBack)

		sent, err := e.d().RecordSent(e.ctx, first)
		require.NoError(t, err)
		require.NotNil(t, sent)
		c = e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1, "the next of the key is claimable once the first is sent")
		require.Equal(t, second, c.Claimed[0].MessageID)
		ok, err := e.d().MarkSent(e.ctx, second)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = e.d().Unpark(e.ctx, storedriver.OrderingRules{})
		require.NoError(t, err)
		c = e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1)
		require.Equal(t, third, c.Claimed[0].MessageID)
	})

	// Under the default rules a dead message blocks the later messages of its key (any
	// topic) until it is discarded (or redriven and sent).
	t.Run("DeadBlocksItsKeyUntilDiscarded", func(t *testing.T) {
		e := newEnv(t, h)
		first := e.enqueue(keyed("order.event", "order-1", 1))[0].MessageID
		e.claimOnly(first)
		e.deadLetter(first, "order.event", "run-1")
		next := e.enqueue(keyed("order.other", "order-1", 2), keyed("order.event", "order-2", 1))
		c := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1, "only the other key's message")
		require.Equal(t, next[1].MessageID, c.Claimed[0].MessageID)
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed)
		st, err := e.d().Stats(e.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.HeldBack)
		require.EqualValues(t, 1, st.KeysBlockedByDead)

		require.NoError(t, e.d().Discard(e.ctx, first, "ops"))
		c = e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1, "discarding the dead message releases its key")
		require.Equal(t, next[0].MessageID, c.Claimed[0].MessageID)
	})

	// With Skipping rules for the dead message's topic, later messages of the key go on;
	// a rules change reaches rows already held back through Unpark.
	t.Run("SkippingRules", func(t *testing.T) {
		e := newEnv(t, h)
		skipping := storedriver.OrderingRules{Listed: []string{"order.event"}, Skipping: []string{"order.event"}}
		first := e.enqueue(keyed("order.event", "order-1", 1))[0].MessageID
		e.claimOnly(first)
		e.deadLetter(first, "order.event", "run-1")
		second := e.enqueue(keyed("order.event", "order-1", 2))[0].MessageID
		c := e.claim(10, skipping)
		require.Len(t, c.Claimed, 1, "the dead message's topic skips dead messages")
		require.Equal(t, second, c.Claimed[0].MessageID)

		// Another key, held back under the default rules first, then released by Unpark
		// once the rules skip dead messages of every topic.
		a := e.enqueue(keyed("order.other", "order-2", 1))[0].MessageID
		e.claimOnly(a)
		e.deadLetter(a, "order.other", "run-1")
		b := e.enqueue(keyed("order.other", "order-2", 2))[0].MessageID
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed)
		require.Empty(t, e.claim(10, skipping).Claimed, "order.other is not listed: its dead message blocks")
		all := storedriver.OrderingRules{DefaultSkipping: true}
		n, err := e.d().Unpark(e.ctx, all)
		require.NoError(t, err)
		require.LessOrEqual(t, n, int64(1))
		c = e.claim(10, all)
		require.Len(t, c.Claimed, 1)
		require.Equal(t, b, c.Claimed[0].MessageID)
	})

	// Unordered topics are never held back by their key; ordered ones still are.
	t.Run("UnorderedTopics", func(t *testing.T) {
		e := newEnv(t, h)
		rules := storedriver.OrderingRules{Listed: []string{"audit.log", "order.event"}, Unordered: []string{"audit.log"}}
		res := e.enqueue(keyed("order.event", "k", 1), keyed("audit.log", "k", 2), keyed("audit.log", "k", 3), keyed("order.event", "k", 4))
		c := e.claim(10, rules)
		got := map[uuid.UUID]bool{}
		for _, r := range c.Claimed {
			got[r.MessageID] = true
		}
		require.Equal(t, map[uuid.UUID]bool{res[0].MessageID: true, res[1].MessageID: true, res[2].MessageID: true}, got,
			"the unordered rows go with the first; the last order.event row waits for all three")
		for _, r := range c.Claimed {
			ok, err := e.d().MarkSent(e.ctx, r.MessageID)
			require.NoError(t, err)
			require.True(t, ok)
		}
		c = e.claim(10, rules)
		require.Len(t, c.Claimed, 1)
		require.Equal(t, res[3].MessageID, c.Claimed[0].MessageID)

		// DefaultUnordered: topics not listed are not ordered.
		all := storedriver.OrderingRules{DefaultUnordered: true}
		more := e.enqueue(keyed("x.event", "j", 1), keyed("x.event", "j", 2))
		c = e.claim(10, all)
		got = map[uuid.UUID]bool{}
		for _, r := range c.Claimed {
			got[r.MessageID] = true
		}
		require.Equal(t, map[uuid.UUID]bool{more[0].MessageID: true, more[1].MessageID: true}, got)
	})

	// A claimed message whose lease ran out while its topic was paused is parked by the
	// next claim, with its claim (and its run) intact. When that run records it sent, the
	// message is no longer parked, and the release hands over the next message of its key
	// at once: the release must not pick the message being released itself.
	t.Run("AMessageParkedWhileClaimedReleasesItsKeyWhenSent", func(t *testing.T) {
		e := newEnv(t, h)
		res := e.enqueue(keyed("paused.topic", "k", 1), keyed("order.event", "k", 2))
		x, y := res[0].MessageID, res[1].MessageID
		c := e.claimOnly(x)
		_, _, err := e.d().PauseTopic(e.ctx, "paused.topic", "ops", "")
		require.NoError(t, err)
		e.shift("lease_until", c.ID)
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed)
		require.True(t, e.get(x).HeldBack, "parked by the claim, its run still going")
		ok, err := e.d().MarkSent(e.ctx, x)
		require.NoError(t, err)
		require.True(t, ok)
		require.False(t, e.get(x).HeldBack, "a sent message is not parked")
		next := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, next.Claimed, 1, "the next of the key, without a sweep")
		require.Equal(t, y, next.Claimed[0].MessageID)
	})

	// A topic set to ordering off while its messages were parked behind a dead one of their
	// key, and behind another parked message of an ordered topic: the sweep (Unpark) puts
	// them back on the claim's path wherever they stand in the key; the ordered one stays.
	t.Run("OrderingTurnedOffReleasesParkedRowsBehindABlockedKey", func(t *testing.T) {
		e := newEnv(t, h)
		dead := e.enqueue(keyed("order.event", "k", 1))[0].MessageID
		e.claimOnly(dead)
		e.deadLetter(dead, "order.event", "run-1")
		res := e.enqueue(keyed("order.event", "k", 2), keyed("audit.log", "k", 3), keyed("audit.log", "k", 4))
		c := e.claim(10, storedriver.OrderingRules{})
		require.Empty(t, c.Claimed)
		require.Equal(t, 3, c.Parked)

		for _, rules := range []storedriver.OrderingRules{
			{Listed: []string{"audit.log", "order.event"}, Unordered: []string{"audit.log"}},
			{Listed: []string{"order.event"}, DefaultUnordered: true},
		} {
			n, err := e.d().Unpark(e.ctx, rules)
			require.NoError(t, err)
			c = e.claim(10, rules)
			got := map[uuid.UUID]bool{}
			for _, r := range c.Claimed {
				got[r.MessageID] = true
			}
			require.Equal(t, map[uuid.UUID]bool{res[1].MessageID: true, res[2].MessageID: true}, got, "rules %+v, %d unparked", rules, n)
			require.True(t, e.get(res[0].MessageID).HeldBack, "the ordered topic's row waits for the dead one")
			// Back to parked, for the second form of the rules.
			for _, r := range c.Claimed {
				e.shift("lease_until", r.ID)
			}
			c = e.claim(10, storedriver.OrderingRules{})
			require.Empty(t, c.Claimed)
		}
	})
}

// orderingUnderConcurrentWriters: four writers commit messages of one shared key (and of
// keys of their own, and without a key) concurrently; then a relay loop claims twice,
// hands over, and sends. Every key's messages must be claimed in the order of their
// sequence numbers, each only after the one before it was sent, and a writer's messages
// in the order it enqueued them.
func orderingUnderConcurrentWriters(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const writers, perWriter = 4, 20
	type sent struct {
		res    storedriver.Enqueued
		key    string
		writer int
		i      int
	}
	var (
		mu       sync.Mutex
		enqueued []sent
		wg       sync.WaitGroup
		errs     = make(chan error, writers)
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				msgs := []storedriver.Message{{Topic: "order.event", OrderingKey: "shared",
					Payload: json.RawMessage(fmt.Sprintf(`{"w": %d, "i": %d}`, w, i))}}
				if i%4 == 0 {
					msgs = append(msgs,
						storedriver.Message{Topic: "order.event", OrderingKey: fmt.Sprintf("own-%d", w), Payload: json.RawMessage(fmt.Sprintf(`{"w": %d, "i": %d}`, w, i))},
						storedriver.Message{Topic: "order.unkeyed", Payload: json.RawMessage(fmt.Sprintf(`{"w": %d, "i": %d}`, w, i))})
				}
				var got []sent
				err := e.InTx(e.ctx, func(enqueue Enqueue) error {
					got = got[:0]
					for _, m := range msgs {
						res, err := enqueue(e.ctx, m)
						if err != nil {
							return err
						}
						got = append(got, sent{res: res, key: m.OrderingKey, writer: w, i: i})
					}
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("writer %d, transaction %d: %w", w, i, err)
					return
				}
				mu.Lock()
				enqueued = append(enqueued, got...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// The sequence numbers the store gave: per key, distinct; per writer, increasing.
	seqs := map[string][]int64{}
	lastOfWriter := map[string]int64{}
	byID := map[uuid.UUID]sent{}
	for _, s := range enqueued {
		byID[s.res.MessageID] = s
		if s.key == "" {
			require.Zero(t, s.res.OrderingSeq)
			continue
		}
		require.Positive(t, s.res.OrderingSeq)
		seqs[s.key] = append(seqs[s.key], s.res.OrderingSeq)
	}
	for key, list := range seqs {
		slices.Sort(list)
		require.Len(t, slices.Compact(slices.Clone(list)), len(list), "key %s: sequence numbers repeat", key)
	}
	slices.SortFunc(enqueued, func(a, b sent) int { return a.i - b.i })
	for _, s := range enqueued {
		if s.key == "" {
			continue
		}
		wk := fmt.Sprintf("%s/%d", s.key, s.writer)
		require.Greater(t, s.res.OrderingSeq, lastOfWriter[wk], "writer %d's message %d of key %s is numbered before its earlier one", s.writer, s.i, s.key)
		lastOfWriter[wk] = s.res.OrderingSeq
	}
	require.Len(t, seqs["shared"], writers*perWriter)

	// The relay loop.
	next := map[string]int{}  // per key, the index in seqs of the next message due
	lastI := map[[2]int]int{} // per writer and key kind, the last claimed i (+1)
	sentIDs := map[uuid.UUID]bool{}
	for round := 0; len(sentIDs) < len(enqueued); round++ {
		require.Less(t, round, 10*len(enqueued), "the relay loop makes no progress")
		first := e.claim(10, storedriver.OrderingRules{})
		e.dispatch(first.Claimed...)
		// A second claim while the first batch is in flight: it must take nothing of a
		// key the first batch holds.
		second := e.claim(10, storedriver.OrderingRules{})
		e.dispatch(second.Claimed...)
		batch := append(first.Claimed, second.Claimed...)
		if len(batch) == 0 {
			require.True(t, first.Parked+second.Parked > 0,
				"stalled with %d of %d messages sent: nothing claimable and nothing held back", len(sentIDs), len(enqueued))
			continue
		}
		ids := make([]uuid.UUID, len(batch))
		for i, c := range batch {
			ids[i] = c.MessageID
		}
		rows, err := e.d().GetAll(e.ctx, ids)
		require.NoError(t, err)
		inFlight := map[string]bool{}
		for _, c := range batch {
			s, ok := byID[c.MessageID]
			require.True(t, ok, "claimed a message nobody enqueued: %s", c.MessageID)
			require.False(t, sentIDs[c.MessageID], "claimed %s again after it was sent", c.MessageID)
			row := rows[c.MessageID]
			if s.key == "" {
				require.Nil(t, row.OrderingKey)
				continue
			}
			require.NotNil(t, row.OrderingKey)
			require.Equal(t, s.key, *row.OrderingKey)
			require.NotNil(t, row.OrderingSeq)
			require.Equal(t, s.res.OrderingSeq, *row.OrderingSeq)
			require.False(t, inFlight[s.key], "two messages of key %s in flight together", s.key)
			inFlight[s.key] = true
			require.Equal(t, seqs[s.key][next[s.key]], s.res.OrderingSeq,
				"key %s: claimed seq %d, but seq %d is the next undelivered", s.key, s.res.OrderingSeq, seqs[s.key][next[s.key]])
			next[s.key]++
			kind := 0
			if s.key != "shared" {
				kind = 1
			}
			wk := [2]int{s.writer, kind}
			require.Greater(t, s.i+1, lastI[wk], "writer %d's message %d of key %s overtook its earlier one", s.writer, s.i, s.key)
			lastI[wk] = s.i + 1
		}
		for _, c := range batch {
			s, err := e.d().RecordSent(e.ctx, c.MessageID)
			require.NoError(t, err)
			require.NotNil(t, s, "record %s sent", c.MessageID)
			sentIDs[c.MessageID] = true
		}
	}
	for key, list := range seqs {
		require.Equal(t, len(list), next[key], "key %s: every message claimed", key)
	}
	require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed)
	st, err := e.d().Stats(e.ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(enqueued), st.ByStatus[storedriver.StatusSent])
	require.Zero(t, st.HeldBack)
}
