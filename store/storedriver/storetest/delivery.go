package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testDeliverAfter pins Message.DeliverAfter: the row is written at once but not claimed
// before its time; NextDue reports the wait by the database clock; once the time has
// passed the row is claimable and no longer counts for NextDue; a time in the past means
// now.
func testDeliverAfter(t *testing.T, h Harness) {
	e := newEnv(t, h)
	_, ok, err := e.d().NextDue(e.ctx)
	require.NoError(t, err)
	require.False(t, ok, "empty table: nothing waits")

	at := time.Now().Add(time.Hour)
	later := storedriver.Message{Topic: "reminder", Payload: json.RawMessage(`{"later": true}`), DeliverAfter: at}
	farther := storedriver.Message{Topic: "reminder", Payload: json.RawMessage(`{"farther": true}`), DeliverAfter: at.Add(time.Hour)}
	past := storedriver.Message{Topic: "reminder", Payload: json.RawMessage(`{"past": true}`), DeliverAfter: time.Now().Add(-time.Hour)}
	res := e.enqueue(later, farther, past, msg("reminder", `{"now": true}`))
	delayed, farID, pastID, nowID := res[0].MessageID, res[1].MessageID, res[2].MessageID, res[3].MessageID

	row := e.get(delayed)
	require.Equal(t, storedriver.StatusPending, row.Status)
	require.NotNil(t, row.NextRetryAt, "DeliverAfter is the row's next_retry_at")
	require.WithinDuration(t, at, *row.NextRetryAt, time.Second)
	require.Nil(t, e.get(nowID).NextRetryAt, "no DeliverAfter, no next_retry_at")

	c := e.claim(10, storedriver.OrderingRules{})
	got := []uuid.UUID{}
	for _, r := range c.Claimed {
		got = append(got, r.MessageID)
	}
	require.ElementsMatch(t, []uuid.UUID{pastID, nowID}, got, "only the rows already due")

	wait, ok, err := e.d().NextDue(e.ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.InDelta(t, time.Hour.Seconds(), wait.Seconds(), 60, "wait %s: the earliest delayed row", wait)

	// Its time passes (moved back two days).
	e.shift("next_retry_at", row.ID)
	wait, ok, err = e.d().NextDue(e.ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.InDelta(t, (2 * time.Hour).Seconds(), wait.Seconds(), 60, "wait %s: the row due now no longer counts", wait)
	c = e.claim(10, storedriver.OrderingRules{})
	require.Len(t, c.Claimed, 1)
	require.Equal(t, delayed, c.Claimed[0].MessageID)

	e.shift("next_retry_at", e.get(farID).ID)
	_, ok, err = e.d().NextDue(e.ctx)
	require.NoError(t, err)
	require.False(t, ok, "nothing waits for its time")
	c = e.claim(10, storedriver.OrderingRules{})
	require.Len(t, c.Claimed, 1)
	require.Equal(t, farID, c.Claimed[0].MessageID)

	backlog, err := e.d().Backlog(e.ctx)
	require.NoError(t, err)
	pending, _ := storedriver.TotalBacklog(backlog)
	require.EqualValues(t, 4, pending, "claimed rows are not handed over yet")
}

// testTransitions pins every status change after the claim: RecordSent, RecordSentAll and
// MarkSent (→ sent, once; a batch run's rows with their batch), RecordFailure (counts
// attempts on the row), DeadLetter (→ dead with a dead letter, once per run), Redrive and
// Discard (operator actions on dead rows only, each audited), ListDeadLetters, and
// reconciliation's ClaimStaleDispatched and Repair.
func testTransitions(t *testing.T, h Harness) {
	t.Run("Sent", func(t *testing.T) {
		e := newEnv(t, h)
		c := e.dispatched("order.created")
		s, err := e.d().RecordSent(e.ctx, c.MessageID)
		require.NoError(t, err)
		require.NotNil(t, s)
		require.Equal(t, "order.created", s.Topic)
		require.Positive(t, s.Latency)
		require.Less(t, s.Latency, time.Minute)
		row := e.get(c.MessageID)
		require.Equal(t, storedriver.StatusSent, row.Status)
		require.NotNil(t, row.SentAt)
		require.WithinDuration(t, time.Now(), *row.SentAt, time.Minute)

		s, err = e.d().RecordSent(e.ctx, c.MessageID)
		require.NoError(t, err)
		require.Nil(t, s, "sent once")
		ok, err := e.d().MarkSent(e.ctx, c.MessageID)
		require.NoError(t, err)
		require.False(t, ok)
		s, err = e.d().RecordSent(e.ctx, uuid.New())
		require.NoError(t, err)
		require.Nil(t, s, "no such message")

		// A workflow may finish before the relay records its start: pending and claimed
		// rows move to sent too, and a late hand-over or failure never moves them back.
		claimed := e.claimed("order.created")
		ok, err = e.d().MarkSent(e.ctx, claimed.MessageID)
		require.NoError(t, err)
		require.True(t, ok)
		n, err := e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{claimed})
		require.NoError(t, err)
		require.Zero(t, n)
		ok, err = e.d().RecordFailure(e.ctx, claimed.MessageID, 1, "late")
		require.NoError(t, err)
		require.False(t, ok)
		ok, err = e.d().DeadLetter(e.ctx, storedriver.DeadLetter{MessageID: claimed.MessageID, Topic: "order.created", WorkflowID: "w", RunID: "r", Attempts: 1, LastError: "late"})
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, storedriver.StatusSent, e.status(claimed.MessageID))
		letters, err := e.d().DeadLetters(e.ctx, claimed.MessageID)
		require.NoError(t, err)
		require.Empty(t, letters, "a sent row gets no dead letter")
		pending := e.pending("order.created")
		s, err = e.d().RecordSent(e.ctx, pending)
		require.NoError(t, err)
		require.NotNil(t, s)
		require.Equal(t, storedriver.StatusSent, e.status(pending))
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed)
	})

	t.Run("Batch", func(t *testing.T) {
		// A batch run's rows: MarkDispatchedAll records the run of each row that has one
		// (Claimed.Batch), RecordSentAll moves its delivered rows in one call and returns
		// them, and a keyed row's release comes with it.
		e := newEnv(t, h)
		ids := e.enqueue(msg("clicks", `{"n": 1}`), msg("clicks", `{"n": 2}`), keyed("clicks", "k", 3), keyed("clicks", "k", 4), msg("clicks", `{"n": 5}`))
		res := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, res.Claimed, 4, "the key's second message waits for its first")
		byID := map[uuid.UUID]storedriver.Claimed{}
		for _, c := range res.Claimed {
			byID[c.MessageID] = c
		}
		const batch = "outbox-batch-0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
		var rows []storedriver.Claimed
		for _, id := range []uuid.UUID{ids[0].MessageID, ids[1].MessageID, ids[2].MessageID} {
			c := byID[id]
			c.Batch = batch
			rows = append(rows, c)
		}
		rows = append(rows, byID[ids[4].MessageID]) // the message lane: no batch
		e.dispatch(rows...)
		for _, id := range []uuid.UUID{ids[0].MessageID, ids[1].MessageID, ids[2].MessageID} {
			row := e.get(id)
			require.Equal(t, storedriver.StatusDispatched, row.Status)
			require.NotNil(t, row.BatchID, "message %s", id)
			require.Equal(t, batch, *row.BatchID)
		}
		require.Nil(t, e.get(ids[4].MessageID).BatchID)
		all, err := e.d().GetAll(e.ctx, []uuid.UUID{ids[0].MessageID, ids[4].MessageID})
		require.NoError(t, err)
		require.Equal(t, batch, *all[ids[0].MessageID].BatchID)
		require.Nil(t, all[ids[4].MessageID].BatchID)

		// A batch takes the rows it may send: claimed ones that name it or no batch, and
		// those dispatched to it; another batch's row and a row that moved on are left alone.
		// (Without claim tokens, as a batch started by a relay of an earlier release takes
		// them; with tokens below.)
		claimedAgain := e.claimed("clicks")
		taken, err := e.d().TakeForBatch(e.ctx, "outbox-batch-other", anyClaim(ids[0].MessageID, claimedAgain.MessageID, uuid.New()))
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{claimedAgain.MessageID}, taken)
		require.Equal(t, "outbox-batch-other", *e.get(claimedAgain.MessageID).BatchID)
		require.Equal(t, storedriver.StatusClaimed, e.status(claimedAgain.MessageID), "no status changes")
		taken, err = e.d().TakeForBatch(e.ctx, batch, anyClaim(ids[0].MessageID, ids[1].MessageID, claimedAgain.MessageID))
		require.NoError(t, err)
		require.ElementsMatch(t, []uuid.UUID{ids[0].MessageID, ids[1].MessageID}, taken, "its own rows, again")
		// A row dispatched to a run of its own is that run's to send: no batch takes it.
		ownRun, err := e.d().TakeForBatch(e.ctx, batch, anyClaim(ids[4].MessageID))
		require.NoError(t, err)
		require.Empty(t, ownRun)
		require.Nil(t, e.get(ids[4].MessageID).BatchID)
		nothing, err := e.d().TakeForBatch(e.ctx, batch, nil)
		require.NoError(t, err)
		require.Empty(t, nothing)
		reclaimed := e.claim(10, storedriver.OrderingRules{})
		require.Empty(t, reclaimed.Claimed, "nothing else is due")
		e.shift("lease_until", claimedAgain.ID)
		reclaim := e.claimOnly(claimedAgain.MessageID)
		require.Equal(t, "outbox-batch-other", reclaim.Batch, "the claim reads the row's batch")
		require.True(t, reclaim.MayHaveBeenSent(), "a row a batch had may have been sent")

		// A batch that takes a row after another claim read it (the batch of an earlier
		// claim, whose send came late, started by a relay of an earlier release: without
		// the claim's token, which would keep it from taking the row, as below) holds it:
		// the later claim's hand-over to another batch, or to a run of its own, leaves it
		// to that batch, and the other batch does not take it. The claim's own batch, and
		// the one it read, may be recorded.
		late := e.claimed("clicks")
		e.shift("lease_until", late.ID)
		late = e.claimOnly(late.MessageID)
		taken, err = e.d().TakeForBatch(e.ctx, "outbox-batch-late", anyClaim(late.MessageID))
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{late.MessageID}, taken)
		for _, to := range []string{"outbox-batch-new", ""} {
			hand := late
			hand.Batch = to
			marked, err := e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{hand})
			require.NoError(t, err)
			require.Zero(t, marked, "handed to %q while a batch holds it", to)
		}
		newer, err := e.d().TakeForBatch(e.ctx, "outbox-batch-new", anyClaim(late.MessageID))
		require.NoError(t, err)
		require.Empty(t, newer)
		require.Equal(t, "outbox-batch-late", *e.get(late.MessageID).BatchID)
		require.Equal(t, storedriver.StatusClaimed, e.status(late.MessageID))
		hand := late
		hand.Batch = "outbox-batch-late"
		marked, err := e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{hand})
		require.NoError(t, err)
		require.Equal(t, 1, marked, "to the batch that holds it")
		// The claim's own batch, taken before its hand-over was recorded (the usual case
		// when the batch run starts at once), and a batch the claim read, cleared by a run
		// of its own: both are recorded.
		fresh := e.claimed("clicks")
		fresh.Batch = "outbox-batch-fresh"
		taken, err = e.d().TakeForBatch(e.ctx, fresh.Batch, []storedriver.BatchTake{{MessageID: fresh.MessageID, ClaimToken: fresh.ClaimToken}})
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{fresh.MessageID}, taken, "under the claim that handed it over")
		marked, err = e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{fresh})
		require.NoError(t, err)
		require.Equal(t, 1, marked)
		reclaim.Batch = ""
		marked, err = e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{reclaim})
		require.NoError(t, err)
		require.Equal(t, 1, marked)
		require.Nil(t, e.get(reclaim.MessageID).BatchID, "a run of its own clears the batch the claim read")

		// A batch that knows the claim that handed a row to it takes the row only while
		// that claim holds it: a row claimed again since (the earlier claim's lease ran
		// out before its batch sent) is the new claim's to hand over, here to a run of its
		// own, which sends it; the earlier claim's batch never does.
		lapsed := e.claimed("clicks")
		e.shift("lease_until", lapsed.ID)
		current := e.claimOnly(lapsed.MessageID)
		require.NotEqual(t, lapsed.ClaimToken, current.ClaimToken)
		staleTake := []storedriver.BatchTake{{MessageID: lapsed.MessageID, ClaimToken: lapsed.ClaimToken}}
		taken, err = e.d().TakeForBatch(e.ctx, "outbox-batch-stale", staleTake)
		require.NoError(t, err)
		require.Empty(t, taken, "claimed again since")
		require.Nil(t, e.get(lapsed.MessageID).BatchID)
		marked, err = e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{current})
		require.NoError(t, err)
		require.Equal(t, 1, marked, "the new claim's hand-over to a run of its own")
		taken, err = e.d().TakeForBatch(e.ctx, "outbox-batch-stale", staleTake)
		require.NoError(t, err)
		require.Empty(t, taken, "a run of its own has it")
		// A row the batch took under its claim stays the batch's when claimed again: the
		// batch's retried take still finds it, whatever claim holds it now.
		kept := e.claimed("clicks")
		keptTake := []storedriver.BatchTake{{MessageID: kept.MessageID, ClaimToken: kept.ClaimToken}}
		taken, err = e.d().TakeForBatch(e.ctx, "outbox-batch-kept", keptTake)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{kept.MessageID}, taken)
		e.shift("lease_until", kept.ID)
		require.Equal(t, "outbox-batch-kept", e.claimOnly(kept.MessageID).Batch)
		taken, err = e.d().TakeForBatch(e.ctx, "outbox-batch-kept", keptTake)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{kept.MessageID}, taken)

		// One of them was sent by its own run before the batch records the others.
		ok, err := e.d().MarkSent(e.ctx, ids[1].MessageID)
		require.NoError(t, err)
		require.True(t, ok)
		sent, err := e.d().RecordSentAll(e.ctx, []uuid.UUID{ids[0].MessageID, ids[1].MessageID, ids[2].MessageID, uuid.New()})
		require.NoError(t, err)
		got := map[uuid.UUID]storedriver.Sent{}
		for _, s := range sent {
			got[s.MessageID] = s
		}
		require.Len(t, got, 2, "the rows it moved, not the one sent already or the missing one: %v", sent)
		for _, id := range []uuid.UUID{ids[0].MessageID, ids[2].MessageID} {
			require.Equal(t, "clicks", got[id].Topic)
			require.Positive(t, got[id].Latency)
			require.Less(t, got[id].Latency, time.Minute)
			require.Equal(t, storedriver.StatusSent, e.status(id))
		}
		again, err := e.d().RecordSentAll(e.ctx, []uuid.UUID{ids[0].MessageID, ids[2].MessageID})
		require.NoError(t, err)
		require.Empty(t, again, "sent once")
		none, err := e.d().RecordSentAll(e.ctx, nil)
		require.NoError(t, err)
		require.Empty(t, none)
		e.claimOnly(ids[3].MessageID) // released with its key's first message

		// Reconciliation sees the batch of a stale row.
		d := byID[ids[4].MessageID]
		e.shift("updated_at", d.ID)
		stale, err := e.d().ClaimStaleDispatched(e.ctx, time.Minute, 10)
		require.NoError(t, err)
		require.Len(t, stale, 1)
		require.Nil(t, stale[0].BatchID)
		c := e.claimed("clicks")
		c.Batch = batch
		e.dispatch(c)
		e.shift("updated_at", c.ID)
		stale, err = e.d().ClaimStaleDispatched(e.ctx, time.Minute, 10)
		require.NoError(t, err)
		require.Len(t, stale, 1)
		require.NotNil(t, stale[0].BatchID)
		require.Equal(t, batch, *stale[0].BatchID)
	})

	t.Run("RecordFailure", func(t *testing.T) {
		e := newEnv(t, h)
		c := e.dispatched("order.created")
		ok, err := e.d().RecordFailure(e.ctx, c.MessageID, 3, "HTTP 503")
		require.NoError(t, err)
		require.True(t, ok)
		row := e.get(c.MessageID)
		require.Equal(t, 3, row.RetryTimes)
		require.NotNil(t, row.LastError)
		require.Equal(t, "HTTP 503", *row.LastError)
		require.Equal(t, storedriver.StatusDispatched, row.Status)

		ok, err = e.d().RecordFailure(e.ctx, c.MessageID, 2, "a late report of an earlier attempt")
		require.NoError(t, err)
		require.True(t, ok)
		row = e.get(c.MessageID)
		require.Equal(t, 3, row.RetryTimes, "retry_times never decreases")
		require.Equal(t, "a late report of an earlier attempt", *row.LastError, "the last error is kept")

		ok, err = e.d().RecordFailure(e.ctx, uuid.New(), 1, "x")
		require.NoError(t, err)
		require.False(t, ok, "no such message")
	})

	t.Run("DeadLetterRedriveDiscard", func(t *testing.T) {
		e := newEnv(t, h)
		c := e.dispatched("order.created")
		id := c.MessageID
		runs, err := e.d().DeadLetterRunIDs(e.ctx, id)
		require.NoError(t, err)
		require.Empty(t, runs)

		// The run records its failed attempts, then gives up.
		ok, err := e.d().RecordFailure(e.ctx, id, 4, "HTTP 500")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, 4, e.get(id).RetryTimes)
		d := storedriver.DeadLetter{MessageID: id, Topic: "order.created", WorkflowID: "outbox-" + id.String(), RunID: "run-1", Attempts: 4, LastError: "HTTP 500"}
		ok, err = e.d().DeadLetter(e.ctx, d)
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = e.d().DeadLetter(e.ctx, d) // a retried activity
		require.NoError(t, err)
		require.False(t, ok)
		row := e.get(id)
		require.Equal(t, storedriver.StatusDead, row.Status)
		require.Equal(t, "HTTP 500", *row.LastError)
		letters, err := e.d().DeadLetters(e.ctx, id)
		require.NoError(t, err)
		require.Len(t, letters, 1, "one dead letter per run")
		dl := letters[0]
		require.Equal(t, id, dl.MessageID)
		require.Equal(t, "order.created", dl.Topic)
		require.Equal(t, "outbox-"+id.String(), dl.WorkflowID)
		require.Equal(t, "run-1", dl.RunID)
		require.Equal(t, 4, dl.Attempts)
		require.Equal(t, "HTTP 500", dl.LastError)
		require.JSONEq(t, `{"state": "pending"}`, string(dl.Payload))
		require.NotNil(t, dl.MessageCreatedAt)
		require.WithinDuration(t, time.Now(), dl.DeadLetteredAt, time.Minute)
		require.Nil(t, dl.RedrivenAt)
		require.Nil(t, dl.DiscardedAt)
		runs, err = e.d().DeadLetterRunIDs(e.ctx, id)
		require.NoError(t, err)
		require.Equal(t, []string{"run-1"}, runs)
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed, "a dead row is not claimable")

		// Redrive: dead → pending, audited, the dead letter closed.
		_, err = e.d().Redrive(e.ctx, id, " ")
		require.Error(t, err, "the actor is required")
		red, err := e.d().Redrive(e.ctx, id, "alice")
		require.NoError(t, err)
		require.Equal(t, storedriver.Redriven{MessageID: id, Topic: "order.created", RedriveCount: 1}, red)
		row = e.get(id)
		require.Equal(t, storedriver.StatusPending, row.Status)
		require.Zero(t, row.RetryTimes)
		require.Equal(t, 1, row.RedriveCount)
		letters, err = e.d().DeadLetters(e.ctx, id)
		require.NoError(t, err)
		require.NotNil(t, letters[0].RedrivenAt)
		require.Equal(t, "alice", *letters[0].RedrivenBy)
		audit, err := e.d().Audit(e.ctx, id)
		require.NoError(t, err)
		require.Len(t, audit, 1)
		require.Equal(t, "redrive", audit[0].Action)
		require.Equal(t, "alice", audit[0].Actor)
		require.Equal(t, id, audit[0].MessageID)
		require.NotNil(t, audit[0].DeadLetterID)
		require.Equal(t, letters[0].ID, *audit[0].DeadLetterID)
		_, err = e.d().Redrive(e.ctx, id, "bob")
		var notDead *storedriver.NotDeadError
		require.ErrorAs(t, err, &notDead, "a redrive of a redriven (pending) message")
		require.Equal(t, storedriver.StatusPending, notDead.Status)
		require.Equal(t, id, notDead.MessageID)

		// The redriven message is delivered again; a second run gives up on it.
		again := e.claimOnly(id)
		require.Equal(t, 1, again.RedriveCount)
		require.True(t, again.MayHaveBeenSent())
		e.dispatch(again)
		e.deadLetter(id, "order.created", "run-2")
		runs, err = e.d().DeadLetterRunIDs(e.ctx, id)
		require.NoError(t, err)
		require.Equal(t, []string{"run-1", "run-2"}, runs)

		// Discard: dead → discarded, audited; a discarded message is neither redriven
		// nor claimed.
		require.NoError(t, e.d().Discard(e.ctx, id, "carol"))
		require.Equal(t, storedriver.StatusDiscarded, e.status(id))
		letters, err = e.d().DeadLetters(e.ctx, id)
		require.NoError(t, err)
		require.Len(t, letters, 2)
		require.NotNil(t, letters[1].DiscardedAt)
		require.Equal(t, "carol", *letters[1].DiscardedBy)
		audit, err = e.d().Audit(e.ctx, id)
		require.NoError(t, err)
		require.Len(t, audit, 2)
		require.Equal(t, "discard", audit[1].Action)
		require.Equal(t, "carol", audit[1].Actor)
		_, err = e.d().Redrive(e.ctx, id, "dave")
		require.ErrorAs(t, err, &notDead)
		require.Equal(t, storedriver.StatusDiscarded, notDead.Status)
		require.ErrorAs(t, e.d().Discard(e.ctx, id, "dave"), &notDead)
		ok, err = e.d().DeadLetter(e.ctx, storedriver.DeadLetter{MessageID: id, Topic: "order.created", WorkflowID: "w", RunID: "run-3", Attempts: 1, LastError: "x"})
		require.NoError(t, err)
		require.False(t, ok, "a discarded row is left alone")
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed)

		// Operator actions on what is not dead, or does not exist.
		sent := e.sent("order.created")
		require.ErrorAs(t, e.d().Discard(e.ctx, sent, "dave"), &notDead)
		require.Equal(t, storedriver.StatusSent, notDead.Status)
		_, err = e.d().Redrive(e.ctx, uuid.New(), "dave")
		require.ErrorIs(t, err, storedriver.ErrNotFound)
		require.ErrorIs(t, e.d().Discard(e.ctx, uuid.New(), "dave"), storedriver.ErrNotFound)
	})

	// An operator's action on a dead letter chosen from a list goes through only while
	// that letter is still the message's open one.
	t.Run("ActOnTheSelectedDeadLetter", func(t *testing.T) {
		e := newEnv(t, h)
		open := func(id uuid.UUID) []int64 {
			t.Helper()
			letters, err := e.d().DeadLetters(e.ctx, id)
			require.NoError(t, err)
			var ids []int64
			for _, d := range letters {
				if d.RedrivenAt == nil && d.DiscardedAt == nil {
					ids = append(ids, d.ID)
				}
			}
			return ids
		}
		audits := func(id uuid.UUID) int {
			t.Helper()
			a, err := e.d().Audit(e.ctx, id)
			require.NoError(t, err)
			return len(a)
		}

		// Dead-lettered messages first: each claim requires its one row to be due.
		a, b, c, d, f := e.dead("order.created"), e.dead("order.created"), e.dead("order.created"),
			e.dead("order.created"), e.dead("order.created")

		// Selected, then redriven by someone else and dead-lettered again by the new run:
		// neither guarded call touches the new letter.
		selected := open(c)[0]
		_, err := e.d().Redrive(e.ctx, c, "bob")
		require.NoError(t, err)
		e.dispatch(e.claimOnly(c))
		e.deadLetter(c, "order.created", "run-2")
		newer := open(c)
		require.Len(t, newer, 1)
		require.NotEqual(t, selected, newer[0])
		before := audits(c)
		var changed *storedriver.DeadLetterChangedError
		_, err = e.d().RedriveDeadLetter(e.ctx, c, selected, "alice")
		require.ErrorAs(t, err, &changed)
		require.Equal(t, c, changed.MessageID)
		require.Equal(t, selected, changed.DeadLetterID)
		require.ErrorAs(t, e.d().DiscardDeadLetter(e.ctx, c, selected, "alice"), &changed)
		require.Equal(t, storedriver.StatusDead, e.status(c), "the row is left dead")
		require.Equal(t, newer, open(c), "the new letter stays open")
		require.Equal(t, before, audits(c), "nothing is audited")
		require.Equal(t, 1, e.get(c).RedriveCount)

		// The letter is still open: the guarded calls act as the plain ones do.
		red, err := e.d().RedriveDeadLetter(e.ctx, a, open(a)[0], "alice")
		require.NoError(t, err)
		require.Equal(t, storedriver.Redriven{MessageID: a, Topic: "order.created", RedriveCount: 1}, red)
		require.Equal(t, storedriver.StatusPending, e.status(a))
		require.NoError(t, e.d().DiscardDeadLetter(e.ctx, b, open(b)[0], "alice"))
		require.Equal(t, storedriver.StatusDiscarded, e.status(b))
		require.Empty(t, open(a))
		require.Empty(t, open(b))

		// Selected, then redriven by someone else (no new letter yet): the message is not
		// dead, as for the plain call.
		selected = open(d)[0]
		_, err = e.d().Redrive(e.ctx, d, "bob")
		require.NoError(t, err)
		var notDead *storedriver.NotDeadError
		_, err = e.d().RedriveDeadLetter(e.ctx, d, selected, "alice")
		require.ErrorAs(t, err, &notDead)
		require.ErrorAs(t, e.d().DiscardDeadLetter(e.ctx, d, selected, "alice"), &notDead)

		// An ID that is no letter of the message, or none at all.
		_, err = e.d().RedriveDeadLetter(e.ctx, f, newer[0], "alice")
		require.ErrorAs(t, err, &changed)
		_, err = e.d().RedriveDeadLetter(e.ctx, f, 0, "alice")
		require.ErrorContains(t, err, "dead letter ID must be positive, got 0")
		require.ErrorContains(t, e.d().DiscardDeadLetter(e.ctx, f, -1, "alice"), "dead letter ID must be positive, got -1")
		require.Equal(t, storedriver.StatusDead, e.status(f))
		_, err = e.d().RedriveDeadLetter(e.ctx, uuid.New(), 1, "alice")
		require.ErrorIs(t, err, storedriver.ErrNotFound)
	})

	t.Run("ListDeadLetters", func(t *testing.T) {
		e := newEnv(t, h)
		a := e.dead("order.created")
		b := e.dead("order.paid")
		c := e.dead("order.created")

		all, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, all, 3)
		require.Equal(t, []uuid.UUID{c, b, a}, []uuid.UUID{all[0].MessageID, all[1].MessageID, all[2].MessageID}, "newest first")

		paid, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Topic: "order.paid"})
		require.NoError(t, err)
		require.Len(t, paid, 1)
		require.Equal(t, b, paid[0].MessageID)
		created, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Topic: "order.created"})
		require.NoError(t, err)
		require.Len(t, created, 2)
		none, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Topic: "order.unknown"})
		require.NoError(t, err)
		require.Empty(t, none)

		limited, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Limit: 1})
		require.NoError(t, err)
		require.Len(t, limited, 1)
		future, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Since: time.Now().Add(time.Hour)})
		require.NoError(t, err)
		require.Empty(t, future)
		recent, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Since: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
		require.Len(t, recent, 3)
		before, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Until: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
		require.Empty(t, before, "until: only dead letters written before it")
		window, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{
			Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), Topic: "order.created"})
		require.NoError(t, err)
		require.Len(t, window, 2, "since, until and topic together")

		// The error filter: a substring of the last error, without regard to case, with
		// LIKE's wildcards taken as text.
		odd := e.dispatched("order.odd").MessageID
		ok, err := e.d().DeadLetter(e.ctx, storedriver.DeadLetter{MessageID: odd, Topic: "order.odd", WorkflowID: "outbox-" + odd.String(),
			RunID: "run-1", Attempts: 1, LastError: "permanent failure: HTTP 422: discount 100% off_sale"})
		require.NoError(t, err)
		require.True(t, ok)
		for text, want := range map[string][]uuid.UUID{
			"http 422":     {odd},
			"HTTP 500":     {c, b, a},
			"100% off_":    {odd},
			"100%_off":     nil,
			"gave up":      {c, b, a},
			"no such text": nil,
		} {
			got, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{Error: text})
			require.NoError(t, err)
			ids := []uuid.UUID{}
			for _, d := range got {
				ids = append(ids, d.MessageID)
			}
			require.Equal(t, append([]uuid.UUID{}, want...), ids, "error %q", text)
		}
		require.Equal(t, storedriver.StatusDead, e.status(odd), "the filter only reads")
		require.NoError(t, e.d().Discard(e.ctx, odd, "alice"))

		_, err = e.d().Redrive(e.ctx, b, "alice")
		require.NoError(t, err)
		require.NoError(t, e.d().Discard(e.ctx, c, "alice"))
		open, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, open, 1, "redriven and discarded dead letters are closed")
		require.Equal(t, a, open[0].MessageID)
		closed, err := e.d().ListDeadLetters(e.ctx, storedriver.DeadLetterFilter{IncludeClosed: true})
		require.NoError(t, err)
		require.Len(t, closed, 4)
	})

	t.Run("Reconcile", func(t *testing.T) {
		e := newEnv(t, h)
		sentRow, runningRow, againRow := e.dispatched("order.sent"), e.dispatched("order.running"), e.dispatched("order.again")
		fresh := e.dispatched("order.fresh")
		for _, c := range []storedriver.Claimed{sentRow, runningRow, againRow} {
			e.shift("updated_at", c.ID)
		}

		stale, err := e.d().ClaimStaleDispatched(e.ctx, time.Minute, 10)
		require.NoError(t, err)
		byID := map[uuid.UUID]storedriver.Dispatched{}
		for _, d := range stale {
			byID[d.MessageID] = d
		}
		require.Len(t, stale, 3, "the rows dispatched and not updated for longer than the age")
		require.NotContains(t, byID, fresh.MessageID)
		for _, c := range []storedriver.Claimed{sentRow, runningRow, againRow} {
			d, ok := byID[c.MessageID]
			require.True(t, ok)
			require.Equal(t, c.ID, d.ID)
			require.Equal(t, c.Topic, d.Topic)
			require.WithinDuration(t, time.Now(), d.DispatchedAt, time.Minute)
		}
		again, err := e.d().ClaimStaleDispatched(e.ctx, time.Minute, 10)
		require.NoError(t, err)
		require.Empty(t, again, "taking a stale row touches it")

		// Running: nothing to repair; Repair refuses the outcome and leaves the row.
		_, err = e.d().Repair(e.ctx, byID[runningRow.MessageID], storedriver.ReconcileRunning, "still running")
		require.Error(t, err)
		require.Equal(t, storedriver.StatusDispatched, e.status(runningRow.MessageID))

		// Recorded sent: dispatched → sent, audited, once.
		d := byID[sentRow.MessageID]
		ok, err := e.d().Repair(e.ctx, d, storedriver.ReconcileRecordedSent, "workflow completed")
		require.NoError(t, err)
		require.True(t, ok)
		row := e.get(d.MessageID)
		require.Equal(t, storedriver.StatusSent, row.Status)
		require.NotNil(t, row.SentAt)
		audit, err := e.d().Audit(e.ctx, d.MessageID)
		require.NoError(t, err)
		require.Len(t, audit, 1)
		require.Equal(t, "reconcile", audit[0].Action)
		require.Equal(t, "relay", audit[0].Actor)
		require.NotNil(t, audit[0].Detail)
		require.Equal(t, "recorded_sent: workflow completed", *audit[0].Detail)
		ok, err = e.d().Repair(e.ctx, d, storedriver.ReconcileRecordedSent, "again")
		require.NoError(t, err)
		require.False(t, ok, "a repair happens once")

		// A read that is out of date (the row was touched since) repairs nothing.
		d = byID[againRow.MessageID]
		e.shift("updated_at", d.ID)
		reread, err := e.d().ClaimStaleDispatched(e.ctx, time.Minute, 10)
		require.NoError(t, err)
		require.Len(t, reread, 1)
		ok, err = e.d().Repair(e.ctx, d, storedriver.ReconcileHandedOverAgain, "workflow not found")
		require.NoError(t, err)
		require.False(t, ok, "the row changed since it was read")
		require.Equal(t, storedriver.StatusDispatched, e.status(d.MessageID))
		audit, err = e.d().Audit(e.ctx, d.MessageID)
		require.NoError(t, err)
		require.Empty(t, audit)

		// Handed over again: dispatched → pending, audited; the next claim knows an
		// earlier run may have sent it.
		ok, err = e.d().Repair(e.ctx, reread[0], storedriver.ReconcileHandedOverAgain, "workflow not found")
		require.NoError(t, err)
		require.True(t, ok)
		row = e.get(d.MessageID)
		require.Equal(t, storedriver.StatusPending, row.Status)
		require.Nil(t, row.NextRetryAt)
		audit, err = e.d().Audit(e.ctx, d.MessageID)
		require.NoError(t, err)
		require.Len(t, audit, 1)
		require.Equal(t, "handed_over_again: workflow not found", *audit[0].Detail)
		c := e.claimOnly(d.MessageID)
		require.NotNil(t, c.DispatchedAt)
		require.True(t, c.MayHaveBeenSent())

		// Only dispatched rows are repaired.
		ok, err = e.d().Repair(e.ctx, storedriver.Dispatched{ID: c.ID, MessageID: c.MessageID, Topic: c.Topic, UpdatedAt: e.get(c.MessageID).UpdatedAt},
			storedriver.ReconcileRecordedSent, "claimed")
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, storedriver.StatusClaimed, e.status(c.MessageID))

		st, err := e.d().Stats(e.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, st.RepairedLastDay)
	})
}

// anyClaim is messageIDs to take for a batch whatever claim holds them (no claim token),
// as a batch started by a relay of an earlier release takes them.
func anyClaim(messageIDs ...uuid.UUID) []storedriver.BatchTake {
	takes := make([]storedriver.BatchTake, len(messageIDs))
	for i, id := range messageIDs {
		takes[i] = storedriver.BatchTake{MessageID: id}
	}
	return takes
}
