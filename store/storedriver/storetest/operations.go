package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testRetention pins PurgeBatch and Purge: sent rows older than SentAfter (since they were
// sent) and discarded rows older than DiscardedAfter (since their discard) go, with their
// dead letters; rows in any other status and younger rows stay; options below the minimums
// are refused; with Archive the rows move to the archive tables.
func testRetention(t *testing.T, h Harness) {
	opts := func(limit int, archive bool) storedriver.PurgeOptions {
		return storedriver.PurgeOptions{SentAfter: 24 * time.Hour, DiscardedAfter: 24 * time.Hour, Limit: limit, Archive: archive}
	}

	t.Run("Delete", func(t *testing.T) {
		e := newEnv(t, h)
		for _, bad := range []storedriver.PurgeOptions{
			{SentAfter: storedriver.MinRetentionAge - time.Second, DiscardedAfter: time.Hour},
			{SentAfter: time.Hour, DiscardedAfter: 0},
			{SentAfter: time.Hour, DiscardedAfter: time.Hour, Limit: storedriver.MaxPurgeLimit + 1},
		} {
			_, err := e.d().PurgeBatch(e.ctx, bad)
			require.Error(t, err, "%+v", bad)
			_, err = e.d().Purge(e.ctx, bad)
			require.Error(t, err, "%+v", bad)
		}

		// Rows aged two days in every status; the dead ones' states need claims, so the
		// pending ones come last.
		oldDiscarded := e.discarded("order.created")
		oldDead := e.dead("order.created")
		oldDispatched := e.dispatched("order.created").MessageID
		oldSent := e.pending("order.created")
		youngSent := e.pending("order.created")
		for _, id := range []uuid.UUID{oldSent, youngSent} {
			ok, err := e.d().MarkSent(e.ctx, id)
			require.NoError(t, err)
			require.True(t, ok)
		}
		oldPending := e.pending("order.created")
		for _, id := range []uuid.UUID{oldDiscarded, oldDead, oldDispatched, oldPending} {
			e.shift("updated_at", e.get(id).ID)
		}
		e.sentLongAgo(e.get(oldSent).ID)

		res, err := e.d().PurgeBatch(e.ctx, opts(0, false))
		require.NoError(t, err)
		require.Equal(t, storedriver.PurgeResult{SentMessages: 1, DiscardedMessages: 1, DeadLetters: 1, Batches: 1}, res)
		e.requireNotFound(oldSent)
		e.requireNotFound(oldDiscarded)
		letters, err := e.d().DeadLetters(e.ctx, oldDiscarded)
		require.NoError(t, err)
		require.Empty(t, letters, "a purged message takes its dead letters")
		audit, err := e.d().Audit(e.ctx, oldDiscarded)
		require.NoError(t, err)
		require.Empty(t, audit, "and, when deleting, its audit")
		require.Equal(t, storedriver.StatusSent, e.status(youngSent))
		require.Equal(t, storedriver.StatusDead, e.status(oldDead))
		require.Equal(t, storedriver.StatusDispatched, e.status(oldDispatched))
		require.Equal(t, storedriver.StatusPending, e.status(oldPending))
		letters, err = e.d().DeadLetters(e.ctx, oldDead)
		require.NoError(t, err)
		require.Len(t, letters, 1)

		again, err := e.d().Purge(e.ctx, opts(0, false))
		require.NoError(t, err)
		require.Equal(t, storedriver.PurgeResult{Batches: 1}, again, "nothing left to remove")
	})

	t.Run("SentWithoutSentAt", func(t *testing.T) {
		// A row marked sent by hand, without a sent_at, ages from its last change.
		e := newEnv(t, h)
		byHand := e.pending("order.created")
		require.NoError(t, e.Exec(e.ctx, sentByHandSQL[e.Dialect], e.get(byHand).ID))
		young, err := e.d().PurgeBatch(e.ctx, opts(0, false))
		require.NoError(t, err)
		require.Equal(t, storedriver.PurgeResult{Batches: 1}, young, "changed just now")
		e.shift("updated_at", e.get(byHand).ID)
		res, err := e.d().PurgeBatch(e.ctx, opts(0, false))
		require.NoError(t, err)
		require.Equal(t, storedriver.PurgeResult{SentMessages: 1, Batches: 1}, res)
		e.requireNotFound(byHand)
	})

	t.Run("ArchiveInBatches", func(t *testing.T) {
		e := newEnv(t, h)
		discarded := e.discarded("order.created")
		sent := []uuid.UUID{e.pending("order.sent"), e.pending("order.sent")}
		for _, id := range sent {
			ok, err := e.d().MarkSent(e.ctx, id)
			require.NoError(t, err)
			require.True(t, ok)
			e.sentLongAgo(e.get(id).ID)
		}
		sentRow := e.get(sent[0])
		discardedRow := e.get(discarded)
		e.shift("updated_at", discardedRow.ID)

		first, err := e.d().PurgeBatch(e.ctx, opts(1, true))
		require.NoError(t, err)
		require.Equal(t, storedriver.PurgeResult{SentMessages: 1, Batches: 1, More: true}, first, "sent messages first, at most the limit")
		total, err := e.d().Purge(e.ctx, opts(1, true))
		require.NoError(t, err)
		require.Equal(t, 3, total.Batches)
		require.False(t, total.More)
		require.Equal(t, storedriver.PurgeResult{SentMessages: 1, DiscardedMessages: 1, DeadLetters: 1, Batches: 3}, total)
		for _, id := range append(sent, discarded) {
			e.requireNotFound(id)
		}

		// The archive holds the rows: copied back, they read as they were.
		for _, row := range []storedriver.Row{sentRow, discardedRow} {
			require.NoError(t, e.Exec(e.ctx, RestoreSQL[e.Dialect], row.ID), "restore row %d from the archive", row.ID)
			back := e.get(row.MessageID)
			require.Equal(t, row.ID, back.ID)
			require.Equal(t, row.Topic, back.Topic)
			require.Equal(t, row.Status, back.Status)
			require.JSONEq(t, string(row.Payload), string(back.Payload))
		}
	})
}

// testStatsAndBacklog pins Stats (counts per status, every status present; per topic,
// only statuses present; in flight; open and recent dead letters; held-back rows and keys
// blocked by a dead message) and Backlog (pending and claimed rows, held back or not).
func testStatsAndBacklog(t *testing.T, h Harness) {
	e := newEnv(t, h)
	empty, err := e.d().Stats(e.ctx)
	require.NoError(t, err)
	require.Len(t, empty.ByStatus, len(storedriver.Statuses), "every status is present")
	for _, s := range storedriver.Statuses {
		require.Zero(t, empty.ByStatus[s], s)
	}
	require.Empty(t, empty.ByTopic)
	require.Zero(t, empty.OldestPendingAge)
	backlog, err := e.d().Backlog(e.ctx)
	require.NoError(t, err)
	require.Empty(t, backlog)

	claimedB := e.claimed("b")
	e.dispatched("c")
	e.sent("d")
	// A dead message with an ordering key, and a later message of its key.
	deadKeyed := e.enqueue(storedriver.Message{Topic: "e", OrderingKey: "k", Payload: json.RawMessage(`{}`)})[0].MessageID
	e.dispatch(e.claimOnly(deadKeyed))
	e.deadLetter(deadKeyed, "e", "run-1")
	e.discarded("f")
	e.enqueue(msg("a", `{}`), msg("a", `{}`))
	e.enqueue(keyed("g", "h", 1), keyed("g", "h", 2), keyed("g", "k", 2))

	st, err := e.d().Stats(e.ctx)
	require.NoError(t, err)
	require.Equal(t, map[storedriver.Status]int64{
		storedriver.StatusPending: 5, storedriver.StatusClaimed: 1, storedriver.StatusDispatched: 1,
		storedriver.StatusSent: 1, storedriver.StatusDead: 1, storedriver.StatusDiscarded: 1,
	}, st.ByStatus)
	require.Equal(t, map[string]map[storedriver.Status]int64{
		"a": {storedriver.StatusPending: 2},
		"b": {storedriver.StatusClaimed: 1},
		"c": {storedriver.StatusDispatched: 1},
		"d": {storedriver.StatusSent: 1},
		"e": {storedriver.StatusDead: 1},
		"f": {storedriver.StatusDiscarded: 1},
		"g": {storedriver.StatusPending: 3},
	}, st.ByTopic)
	require.EqualValues(t, 2, st.InFlight)
	require.EqualValues(t, 1, st.OpenDeadLetters, "the discarded message's dead letter is closed")
	require.EqualValues(t, 2, st.DeadLettersLastHour)
	require.EqualValues(t, 2, st.DeadLettersLastDay)
	require.EqualValues(t, 2, st.HeldBack, "h's second behind its first, k's behind the dead one")
	require.EqualValues(t, 1, st.KeysBlockedByDead)
	require.Zero(t, st.RepairedLastDay)
	require.GreaterOrEqual(t, st.OldestPendingAge, time.Duration(0))
	require.Less(t, st.OldestPendingAge, time.Minute)
	require.Less(t, st.OldestInFlightAge, time.Minute)
	require.WithinDuration(t, time.Now(), st.At, time.Minute)

	backlog, err = e.d().Backlog(e.ctx)
	require.NoError(t, err)
	pending, age := storedriver.TotalBacklog(backlog)
	require.EqualValues(t, 6, pending, "pending and claimed rows, held back or not")
	require.GreaterOrEqual(t, age, time.Duration(0))
	require.Less(t, age, time.Minute)
	// By topic, in order: a's two, b's claimed one, g's three (two held back).
	var topics []string
	byTopic := map[string]storedriver.TopicBacklog{}
	for _, b := range backlog {
		topics = append(topics, b.Topic)
		byTopic[b.Topic] = b
	}
	require.Equal(t, []string{"a", "b", "g"}, topics)
	require.EqualValues(t, 2, byTopic["a"].Pending)
	require.EqualValues(t, 1, byTopic["b"].Pending)
	require.EqualValues(t, 3, byTopic["g"].Pending)

	// The age is the oldest due row's, by topic: a row due in an hour, however old, and a
	// held-back row do not count; a topic with only such rows has age zero.
	old := e.enqueue(storedriver.Message{Topic: "later", Payload: json.RawMessage(`{}`), DeliverAfter: time.Now().Add(time.Hour)})[0].MessageID
	e.shift("created_at", e.get(old).ID)
	backlog, err = e.d().Backlog(e.ctx)
	require.NoError(t, err)
	for _, b := range backlog {
		if b.Topic == "later" {
			require.EqualValues(t, 1, b.Pending)
			require.Zero(t, b.OldestAge, "not due for an hour")
			continue
		}
		require.Less(t, b.OldestAge, time.Hour, "topic %s", b.Topic)
	}
	_, age = storedriver.TotalBacklog(backlog)
	require.Less(t, age, time.Hour)

	// A claimed row whose lease ran out is no longer in flight: it waits for a relay, and
	// counts in the oldest pending age.
	e.shift("lease_until", claimedB.ID)
	e.shift("created_at", claimedB.ID)
	st, err = e.d().Stats(e.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.InFlight, "the dispatched row only")
	require.Greater(t, st.OldestPendingAge, 24*time.Hour, "the stuck claim, two days old")

	// Stats' oldest pending message is a due one, as the backlog's age: not one of a
	// paused topic, nor one held back behind its ordering key, nor one scheduled for
	// later, however old.
	e2 := newEnv(t, h)
	quiet := e2.enqueue(msg("quiet", `{}`))[0].MessageID
	e2.shift("created_at", e2.get(quiet).ID)
	_, _, err = e2.d().PauseTopic(e2.ctx, "quiet", "ops", "")
	require.NoError(t, err)
	behind := e2.enqueue(keyed("g", "k", 1), keyed("g", "k", 2))[1].MessageID
	require.Len(t, e2.claim(10, storedriver.OrderingRules{}).Claimed, 1, "the key's first")
	require.True(t, e2.get(behind).HeldBack, "the key's second waits for the first")
	e2.shift("created_at", e2.get(behind).ID)
	later := msg("later", `{}`)
	later.DeliverAfter = time.Now().Add(time.Hour)
	scheduled := e2.enqueue(later)[0].MessageID
	e2.shift("created_at", e2.get(scheduled).ID)
	st, err = e2.d().Stats(e2.ctx)
	require.NoError(t, err)
	require.Less(t, st.OldestPendingAge, time.Hour, "nothing due is old (one scheduled for later is not due)")
	due := e2.enqueue(msg("a", `{}`))[0].MessageID
	e2.shift("created_at", e2.get(due).ID)
	st, err = e2.d().Stats(e2.ctx)
	require.NoError(t, err)
	require.Greater(t, st.OldestPendingAge, 24*time.Hour, "a due message two days old")
}

// testPlainSQLRows pins what the store does with rows a writer without the library
// inserted: with only topic and payload the row gets a message ID, is pending, readable
// and claimable; the optional columns are honoured; and a row the store's Validate would
// have refused is still readable and claimable, so the machinery can dead-letter it.
func testPlainSQLRows(t *testing.T, h Harness) {
	t.Run("TopicAndPayloadOnly", func(t *testing.T) {
		e := newEnv(t, h)
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{"topic": "order.created", "payload": `{"order_id": 7}`}))
		c := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1)
		claimed := c.Claimed[0]
		require.NotEqual(t, uuid.Nil, claimed.MessageID, "a message ID is generated")
		require.Equal(t, "order.created", claimed.Topic)
		require.Zero(t, claimed.RetryTimes)
		require.Nil(t, claimed.MaxRetryTimes)
		require.False(t, claimed.MayHaveBeenSent())
		row := e.get(claimed.MessageID)
		require.Equal(t, storedriver.StatusClaimed, row.Status)
		require.JSONEq(t, `{"order_id": 7}`, string(row.Payload))
		require.Empty(t, row.Headers)
		require.Nil(t, row.OrderingKey)
		require.WithinDuration(t, time.Now(), row.CreatedAt, time.Minute)
		e.dispatch(claimed)
		s, err := e.d().RecordSent(e.ctx, claimed.MessageID)
		require.NoError(t, err)
		require.NotNil(t, s)

		// Before any claim, a plain-SQL row is pending.
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{"topic": "order.created", "payload": `[1, 2]`}))
		st, err := e.d().Stats(e.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.ByStatus[storedriver.StatusPending])
	})

	t.Run("OptionalColumns", func(t *testing.T) {
		e := newEnv(t, h)
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{
			"topic": "order.created", "payload": `{"order_id": 8}`, "status": "pending",
			"retry_times": 2, "max_retry_times": 5, "next_retry_at": time.Now().Add(-time.Hour),
		}))
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{
			"topic": "order.later", "payload": `{}`, "next_retry_at": time.Now().Add(time.Hour),
		}))
		c := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1, "the row whose next_retry_at has passed")
		claimed := c.Claimed[0]
		require.Equal(t, "order.created", claimed.Topic)
		require.Equal(t, 2, claimed.RetryTimes)
		require.NotNil(t, claimed.MaxRetryTimes)
		require.Equal(t, 5, *claimed.MaxRetryTimes)
		require.True(t, claimed.MayHaveBeenSent(), "it failed attempts before")
		wait, ok, err := e.d().NextDue(e.ctx)
		require.NoError(t, err)
		require.True(t, ok)
		require.InDelta(t, time.Hour.Seconds(), wait.Seconds(), 60)

		// Keyed plain-SQL rows are numbered and ordered like enqueued ones.
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{"topic": "order.keyed", "payload": `{"n": 1}`, "ordering_key": "order-9"}))
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{"topic": "order.keyed", "payload": `{"n": 2}`, "ordering_key": "order-9"}))
		c = e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 1, "one of the key at a time")
		row := e.get(c.Claimed[0].MessageID)
		require.JSONEq(t, `{"n": 1}`, string(row.Payload))
		require.NotNil(t, row.OrderingSeq)
	})

	t.Run("RowsValidateWouldRefuse", func(t *testing.T) {
		e := newEnv(t, h)
		badTopic := "order created!"
		big := fmt.Sprintf(`{"s": "%s"}`, strings.Repeat("x", e.d().MaxPayloadBytes()))
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{"topic": badTopic, "payload": `{"a": 1}`}))
		require.NoError(t, e.InsertSQL(e.ctx, map[string]any{"topic": "order.big", "payload": big}))

		c := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, c.Claimed, 2, "claimed like any other row")
		fields := map[string]string{}
		for _, claimed := range c.Claimed {
			row := e.get(claimed.MessageID)
			require.Equal(t, claimed.Topic, row.Topic)
			fields[row.Topic] = validationField(t, e.d().Validate(storedriver.Message{Topic: row.Topic, Payload: row.Payload}))
			if row.Topic == "order.big" {
				require.Greater(t, len(row.Payload), e.d().MaxPayloadBytes(), "read whole")
				require.JSONEq(t, big, string(row.Payload))
			} else {
				require.JSONEq(t, `{"a": 1}`, string(row.Payload))
			}
			// The send activity refuses it and dead-letters it.
			e.dispatch(claimed)
			e.deadLetter(claimed.MessageID, row.Topic, "run-1")
			require.Equal(t, storedriver.StatusDead, e.status(claimed.MessageID))
		}
		require.Equal(t, map[string]string{badTopic: "topic", "order.big": "payload"}, fields)
		letters, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Topic: badTopic})
		require.NoError(t, err)
		require.Len(t, letters, 1)
		require.JSONEq(t, `{"a": 1}`, string(letters[0].Payload))
	})
}

// testDeployment pins the deployment's identity: its ID is made at migrate and stays; the
// first task queue recorded stays until MoveTaskQueue moves it.
func testDeployment(t *testing.T, h Harness) {
	e := newEnv(t, h)
	// A store tells the database's answer from no answer, so that a worker waiting for
	// its database at start waits only for the second.
	if a, ok := e.d().(storedriver.Answerer); ok {
		err := e.Exec(e.ctx, "SELECT no_such_column FROM outbox_deployment")
		require.Error(t, err)
		require.True(t, a.Answered(err), "the server's refusal is an answer: %v", err)
		require.False(t, a.Answered(fmt.Errorf("dial tcp 127.0.0.1:1: %w", syscall.ECONNREFUSED)), "a connection refused is none")
		require.False(t, a.Answered(context.DeadlineExceeded))
	}
	id, err := e.d().DeploymentID(e.ctx)
	require.NoError(t, err)
	require.NotEqual(t, uuid.Nil, id)
	again, err := e.d().DeploymentID(e.ctx)
	require.NoError(t, err)
	require.Equal(t, id, again)
	got, tq, err := e.d().Deployment(e.ctx)
	require.NoError(t, err)
	require.Equal(t, id, got)
	require.Empty(t, tq, "no task queue is recorded at migrate")

	other := newEnv(t, h)
	otherID, err := other.d().DeploymentID(other.ctx)
	require.NoError(t, err)
	require.NotEqual(t, id, otherID, "two outbox databases are two deployments")

	_, _, err = e.d().RecordTaskQueue(e.ctx, "")
	require.Error(t, err)
	got, recorded, err := e.d().RecordTaskQueue(e.ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, id, got)
	require.Equal(t, "orders", recorded)
	_, recorded, err = e.d().RecordTaskQueue(e.ctx, "billing")
	require.NoError(t, err)
	require.Equal(t, "orders", recorded, "the first task queue recorded stays")

	require.Error(t, e.d().MoveTaskQueue(e.ctx, ""))
	require.NoError(t, e.d().MoveTaskQueue(e.ctx, "billing"))
	got, tq, err = e.d().Deployment(e.ctx)
	require.NoError(t, err)
	require.Equal(t, id, got)
	require.Equal(t, "billing", tq)
	_, recorded, err = e.d().RecordTaskQueue(e.ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, "billing", recorded)
}

// testMigrate pins Migrate on a migrated database: it applies nothing, and the
// deployment and the rows stay.
func testMigrate(t *testing.T, h Harness) {
	e := newEnv(t, h)
	require.Equal(t, e.Dialect, e.d().Kind())
	require.NotEmpty(t, e.d().Schema())
	id, err := e.d().DeploymentID(e.ctx)
	require.NoError(t, err)
	msgID := e.pending("order.created")

	applied, err := e.d().Migrate(e.ctx)
	require.NoError(t, err)
	require.Empty(t, applied)
	applied, err = e.d().Migrate(e.ctx)
	require.NoError(t, err)
	require.Empty(t, applied)

	again, _, err := e.d().Deployment(e.ctx)
	require.NoError(t, err)
	require.Equal(t, id, again)
	require.Equal(t, storedriver.StatusPending, e.status(msgID))
}
