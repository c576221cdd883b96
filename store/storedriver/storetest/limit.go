package storetest

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testInFlightLimit pins the claim's limit on a topic's messages in flight
// (OrderingRules.MaxInFlight and TopicMaxInFlight): a claim takes a topic's rows up to its
// room and parks the rest (keyed rows count as in flight but are not parked for it), says
// that rows wait (Waiting), and other topics' later rows are claimed past them; the
// backlog's age counts the waiting rows; the parked rows come back oldest first as the
// topic's messages finish; claimed rows whose lease ran out are not in flight; a paused
// topic's rows stay parked; Unpark without a limit puts every such row back; a topic
// found at its limit has its other due rows parked at once; and a topic's own limit
// overrides the default.
func testInFlightLimit(t *testing.T, h Harness) {
	e := newEnv(t, h)
	two := storedriver.OrderingRules{MaxInFlight: 2}
	var bulk []uuid.UUID
	for range 5 {
		bulk = append(bulk, e.enqueueOne(msg("bulk", `{}`)))
	}
	key1 := e.enqueueOne(keyed("bulk", "order-1", 1))
	key2 := e.enqueueOne(keyed("bulk", "order-2", 1))
	other := e.enqueueOne(msg("other", `{}`))

	res := e.claim(100, two)
	require.ElementsMatch(t, []uuid.UUID{bulk[0], bulk[1], key1, key2, other}, claimedIDs(res),
		"two of the topic's rows without a key, its keyed rows and the other topic's row")
	require.Equal(t, 3, res.Limited)
	require.Equal(t, 3, res.Parked)
	require.True(t, res.Waiting)
	res2 := e.claim(100, two)
	require.Empty(t, res2.Claimed, "the topic has four messages in flight: its rows stay parked")
	require.True(t, res2.Waiting, "they wait for room")
	require.True(t, e.get(bulk[2]).HeldBack, "Get says a row waiting for room is held back")
	require.False(t, e.get(bulk[0]).HeldBack)
	backlog, err := e.d().Backlog(e.ctx)
	require.NoError(t, err)
	require.Equal(t, "bulk", backlog[0].Topic)
	require.EqualValues(t, 7, backlog[0].Pending, "claimed and parked rows")
	require.Positive(t, backlog[0].OldestAge, "rows waiting for room are due: the backlog's age counts them")
	e.dispatch(res.Claimed...)

	later := e.enqueueOne(msg("other", `{}`))
	e.claimOnly(later)

	// Two finish: the topic still has two in flight, so nothing comes back.
	for _, id := range []uuid.UUID{key1, key2} {
		s, err := e.d().RecordSent(e.ctx, id)
		require.NoError(t, err)
		require.NotNil(t, s)
	}
	require.Empty(t, e.claim(100, two).Claimed)
	// One more is sent, one dead-lettered: room for two, the oldest parked rows.
	s, err := e.d().RecordSent(e.ctx, bulk[0])
	require.NoError(t, err)
	require.NotNil(t, s)
	e.deadLetter(bulk[1], "bulk", "run-1")
	res = e.claim(100, two)
	require.Equal(t, []uuid.UUID{bulk[2], bulk[3]}, claimedIDs(res), "oldest first, as many as there is room for")
	require.Zero(t, res.Parked)

	// A claim whose lease ran out holds nothing: its rows are claimed again, before the
	// newer parked row, which the claim unparks and parks again.
	for _, c := range res.Claimed {
		e.shift("lease_until", c.ID)
	}
	res = e.claim(100, two)
	require.ElementsMatch(t, []uuid.UUID{bulk[2], bulk[3]}, claimedIDs(res))
	require.Equal(t, 1, res.Limited)

	// A paused topic's rows parked for the limit stay parked while it is paused, whatever
	// room it has; without a limit, Unpark puts the rest back once it is resumed.
	_, _, err = e.d().PauseTopic(e.ctx, "bulk", "ops", "")
	require.NoError(t, err)
	e.dispatch(res.Claimed...)
	for _, id := range bulk[2:4] {
		s, err := e.d().RecordSent(e.ctx, id)
		require.NoError(t, err)
		require.NotNil(t, s)
	}
	n, err := e.d().Unpark(e.ctx, two)
	require.NoError(t, err)
	require.Zero(t, n, "the topic is paused")
	res = e.claim(100, two)
	require.Empty(t, res.Claimed)
	require.False(t, res.Waiting, "a paused topic's rows wait for the resume, not for room")
	require.NoError(t, e.Exec(e.ctx, `DELETE FROM outbox_topic_pauses WHERE topic = 'bulk'`))
	n, err = e.d().Unpark(e.ctx, storedriver.OrderingRules{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	e.claimOnly(bulk[4])

	// A claim that finds a topic at its limit parks the topic's other due rows too, beyond
	// its own batch, so the next claim reaches a later row of another topic at once.
	var burst []uuid.UUID
	for range 6 {
		burst = append(burst, e.enqueueOne(msg("burst", `{}`)))
	}
	late := e.enqueueOne(msg("late", `{}`))
	one := storedriver.OrderingRules{MaxInFlight: 1}
	res = e.claim(3, one)
	require.Equal(t, []uuid.UUID{burst[0]}, claimedIDs(res))
	require.Equal(t, 5, res.Limited, "two of the batch and the three after it")
	require.Equal(t, []uuid.UUID{late}, claimedIDs(e.claim(3, one)))
	e.dispatch(res.Claimed...)
	s, err = e.d().RecordSent(e.ctx, burst[0])
	require.NoError(t, err)
	require.NotNil(t, s)
	require.Equal(t, []uuid.UUID{burst[1]}, claimedIDs(e.claim(3, one)), "the oldest parked row, once there is room")

	// A topic's own limit overrides the default one; 0 sets none; a topic may have a
	// limit when the others have none.
	own := storedriver.OrderingRules{MaxInFlight: 1, TopicMaxInFlight: map[string]int{"wide": 3, "free": 0}}
	for range 4 {
		e.enqueueOne(msg("wide", `{}`))
		e.enqueueOne(msg("free", `{}`))
	}
	res = e.claim(100, own)
	byTopic := map[string]int{}
	for _, c := range res.Claimed {
		byTopic[c.Topic]++
	}
	require.Equal(t, map[string]int{"wide": 3, "free": 4}, byTopic, "burst still has one in flight: its rows stay parked")
	require.Equal(t, 1, res.Limited)
	solo := e.enqueueOne(msg("solo", `{}`))
	e.enqueueOne(msg("solo", `{}`))
	res = e.claim(100, storedriver.OrderingRules{TopicMaxInFlight: map[string]int{"solo": 1}})
	var solos []uuid.UUID
	for _, c := range res.Claimed {
		if c.Topic == "solo" {
			solos = append(solos, c.MessageID)
		}
	}
	require.Equal(t, []uuid.UUID{solo}, solos)
	require.Equal(t, 1, res.Limited)
	require.Len(t, res.Claimed, 1+4+1, "without a limit of their own, the parked rows of burst (4) and wide (1) are put back and claimed")
}
