package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testPause pins what a paused topic does to the store: the claim parks its rows (delayed
// ones too) and takes the other topics' rows past them; Get, Backlog and Stats name the
// pause; a second pause keeps the first; resuming puts the rows back on the claim's path
// (keyed rows still in their key's order); a row a claim parked as the resume ran is put
// back by Unpark; and bad arguments are refused with the value and what is allowed.
func testPause(t *testing.T, h Harness) {
	e := newEnv(t, h)
	none, err := e.d().PausedTopics(e.ctx)
	require.NoError(t, err)
	require.Empty(t, none)

	p, made, err := e.d().PauseTopic(e.ctx, "slow", "ops@example.com", "downstream maintenance until 14:00")
	require.NoError(t, err)
	require.True(t, made)
	require.Equal(t, "slow", p.Topic)
	require.Equal(t, "ops@example.com", p.PausedBy)
	require.Equal(t, "downstream maintenance until 14:00", p.Reason)
	require.WithinDuration(t, time.Now(), p.PausedAt, time.Minute)
	again, made, err := e.d().PauseTopic(e.ctx, "slow", "someone-else", "")
	require.NoError(t, err)
	require.False(t, made, "the topic was paused already")
	require.Equal(t, p, again, "the first pause is kept")

	// Rows of the paused topic, keyed and not, one delayed and now due, among rows of
	// another topic.
	slow := []uuid.UUID{
		e.enqueueOne(msg("slow", `{"n": 1}`)),
		e.enqueueOne(keyed("slow", "order-1", 2)),
		e.enqueueOne(keyed("slow", "order-1", 3)),
	}
	delayed := e.enqueueOne(storedriver.Message{Topic: "slow", Payload: json.RawMessage(`{}`), DeliverAfter: time.Now().Add(time.Hour)})
	e.shift("next_retry_at", e.get(delayed).ID)
	slow = append(slow, delayed)
	fast := e.enqueueOne(msg("fast", `{}`))

	res := e.claim(100, storedriver.OrderingRules{})
	require.Len(t, res.Claimed, 1, "only the other topic's row is claimed")
	require.Equal(t, fast, res.Claimed[0].MessageID)
	require.Equal(t, len(slow), res.Parked, "the paused topic's rows are parked")
	for _, id := range slow {
		row := e.get(id)
		require.Equal(t, storedriver.StatusPending, row.Status)
		require.True(t, row.Paused, "Get names the pause")
	}
	require.False(t, e.get(fast).Paused)
	require.Empty(t, e.claim(100, storedriver.OrderingRules{}).Claimed, "parked rows stay off the claim's path")
	n, err := e.d().Unpark(e.ctx, storedriver.OrderingRules{})
	require.NoError(t, err)
	require.Zero(t, n, "the sweep leaves a paused topic's rows parked")
	require.Empty(t, e.claim(100, storedriver.OrderingRules{}).Claimed)

	backlog, err := e.d().Backlog(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []storedriver.TopicBacklog{
		{Topic: "fast", Pending: 1, OldestAge: backlog[0].OldestAge},
		{Topic: "slow", Pending: int64(len(slow)), Paused: true},
	}, backlog, "a paused topic has nothing due: age zero")
	_, _, err = e.d().PauseTopic(e.ctx, "idle", "ops", "")
	require.NoError(t, err)
	backlog, err = e.d().Backlog(e.ctx)
	require.NoError(t, err)
	require.Len(t, backlog, 3)
	require.Equal(t, storedriver.TopicBacklog{Topic: "idle", Paused: true}, backlog[1], "a paused topic without rows is listed")
	st, err := e.d().Stats(e.ctx)
	require.NoError(t, err)
	require.Len(t, st.Paused, 2)
	require.Equal(t, []string{"idle", "slow"}, []string{st.Paused[0].Topic, st.Paused[1].Topic})
	require.Equal(t, p, st.Paused[1])

	// Resume: the rows are claimable again, keyed ones in their key's order.
	ended, resumed, err := e.d().ResumeTopic(e.ctx, "slow")
	require.NoError(t, err)
	require.True(t, resumed)
	require.Equal(t, p, ended)
	_, resumed, err = e.d().ResumeTopic(e.ctx, "slow")
	require.NoError(t, err)
	require.False(t, resumed, "a topic not paused has nothing to resume")
	require.False(t, e.get(slow[0]).Paused)
	res = e.claim(100, storedriver.OrderingRules{})
	require.ElementsMatch(t, []uuid.UUID{slow[0], slow[1], slow[3]}, claimedIDs(res), "the key's second message waits for its first")
	e.dispatch(res.Claimed...)
	sent, err := e.d().RecordSent(e.ctx, slow[1])
	require.NoError(t, err)
	require.NotNil(t, sent)
	e.claimOnly(slow[2])

	// A claim that parked a row as the resume ran: the sweep puts it back.
	_, _, err = e.d().PauseTopic(e.ctx, "raced", "ops", "")
	require.NoError(t, err)
	raced := e.enqueueOne(msg("raced", `{}`))
	require.Equal(t, 1, e.claim(100, storedriver.OrderingRules{}).Parked)
	require.NoError(t, e.Exec(e.ctx, `DELETE FROM outbox_topic_pauses WHERE topic = 'raced'`))
	require.Empty(t, e.claim(100, storedriver.OrderingRules{}).Claimed, "still parked: no claim looks at it")
	n, err = e.d().Unpark(e.ctx, storedriver.OrderingRules{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	e.claimOnly(raced)

	// Bad arguments name the value and what is allowed; nothing is paused.
	for _, bad := range []struct{ topic, actor, reason, want string }{
		{"", "ops", "", "topic must match"},
		{"has space", "ops", "", `topic must match ^[A-Za-z0-9._-]{1,200}$, got "has space"`},
		{"ok", "", "", "actor must be 1 to 200 bytes"},
		{"ok", "ops", string(make([]byte, 1001)), "reason must be at most 1000 bytes"},
	} {
		_, _, err := e.d().PauseTopic(e.ctx, bad.topic, bad.actor, bad.reason)
		require.ErrorContains(t, err, bad.want)
	}
	paused, err := e.d().PausedTopics(e.ctx)
	require.NoError(t, err)
	require.Len(t, paused, 1)
	require.Equal(t, "idle", paused[0].Topic)
}

func claimedIDs(res storedriver.ClaimResult) []uuid.UUID {
	ids := make([]uuid.UUID, len(res.Claimed))
	for i, c := range res.Claimed {
		ids[i] = c.MessageID
	}
	return ids
}
