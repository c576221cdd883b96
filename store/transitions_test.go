package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// One test per status transition: each sets up a row in the source state through the
// store's API, calls the transition's one writer, checks the row in the table, and checks
// that the writer changes nothing on a row in a state it must not move from.

// rows puts rows into each state through the store's API, in a schema of their own. Each
// helper leaves no pending row behind, so a later claim takes only its own row: create
// the pending rows of a test last.
type rowsIn struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	st   *store.Store
}

func newRowsIn(t *testing.T) rowsIn {
	t.Helper()
	t.Parallel()
	pool, st := testdb.Schema(t)
	return rowsIn{t: t, ctx: context.Background(), pool: pool, st: st}
}

func (r rowsIn) pending() uuid.UUID {
	r.t.Helper()
	id, err := r.st.Enqueue(r.ctx, r.st.DB(), store.Message{Topic: "order.created", Payload: json.RawMessage(`{"n": 1}`)})
	require.NoError(r.t, err)
	return id
}

func (r rowsIn) claimed() store.Claimed {
	r.t.Helper()
	id := r.pending()
	res, err := r.st.ClaimBatch(r.ctx, 100, time.Minute, store.OrderingRules{})
	require.NoError(r.t, err)
	require.Len(r.t, res.Claimed, 1, "set-up claims only its own row")
	require.Equal(r.t, id, res.Claimed[0].MessageID)
	return res.Claimed[0]
}

// dispatched returns the row as reconciliation reads it (which touches it).
func (r rowsIn) dispatched() store.Dispatched {
	r.t.Helper()
	c := r.claimed()
	n, err := r.st.MarkDispatchedAll(r.ctx, []store.Claimed{c})
	require.NoError(r.t, err)
	require.Equal(r.t, 1, n)
	return r.readDispatched(c.MessageID)
}

// readDispatched reads the dispatched row id as the reconciler does: ClaimStaleDispatched.
func (r rowsIn) readDispatched(id uuid.UUID) store.Dispatched {
	r.t.Helper()
	stale, err := r.st.ClaimStaleDispatched(r.ctx, 0, 100)
	require.NoError(r.t, err)
	for _, d := range stale {
		if d.MessageID == id {
			return d
		}
	}
	r.t.Fatalf("dispatched row %s not found", id)
	return store.Dispatched{}
}

func (r rowsIn) sent() uuid.UUID {
	r.t.Helper()
	id := r.dispatched().MessageID
	sent, err := r.st.RecordSent(r.ctx, id)
	require.NoError(r.t, err)
	require.NotNil(r.t, sent)
	return id
}

func (r rowsIn) dead() uuid.UUID {
	r.t.Helper()
	id := r.dispatched().MessageID
	// A run records its failed attempts before it gives up, so a redrive has them to reset.
	ok, err := r.st.RecordFailure(r.ctx, id, 3, "HTTP 500")
	require.NoError(r.t, err)
	require.True(r.t, ok)
	ok, err = r.st.DeadLetter(r.ctx, store.DeadLetter{MessageID: id, WorkflowID: "outbox-" + id.String(), RunID: uuid.NewString(), Attempts: 3, LastError: "HTTP 500"})
	require.NoError(r.t, err)
	require.True(r.t, ok)
	return id
}

func (r rowsIn) discarded() uuid.UUID {
	r.t.Helper()
	id := r.dead()
	require.NoError(r.t, r.st.Discard(r.ctx, id, "alice"))
	return id
}

// row returns the whole row, to compare before and after a refused transition.
func (r rowsIn) row(id uuid.UUID) map[string]any {
	r.t.Helper()
	var m map[string]any
	require.NoError(r.t, r.pool.QueryRow(r.ctx, `SELECT to_jsonb(m) FROM `+r.st.Schema()+`.outbox_messages m WHERE message_id = $1`, id).Scan(&m))
	return m
}

// unchanged runs refuse on each row and requires that it changed none of them.
func (r rowsIn) unchanged(ids []uuid.UUID, refuse func(id uuid.UUID)) {
	r.t.Helper()
	for _, id := range ids {
		before := r.row(id)
		refuse(id)
		require.Equal(r.t, before, r.row(id), "row %s (%s) must not move", id, before["status"])
	}
}

// asDispatched is a row as reconciliation would have read it, whatever its state.
func (r rowsIn) asDispatched(id uuid.UUID) store.Dispatched {
	r.t.Helper()
	row, err := r.st.Get(r.ctx, id)
	require.NoError(r.t, err)
	return store.Dispatched{ID: row.ID, MessageID: id, Topic: row.Topic, UpdatedAt: row.UpdatedAt}
}

func (r rowsIn) audit(id uuid.UUID) []store.AuditEntry {
	r.t.Helper()
	a, err := r.st.Audit(r.ctx, id)
	require.NoError(r.t, err)
	return a
}

// pending → claimed, and claimed whose lease ended → claimed under a new token: ClaimBatch.
func TestTransitionClaim(t *testing.T) {
	r := newRowsIn(t)
	live, dispatched, sent, dead, discarded := r.claimed(), r.dispatched().MessageID, r.sent(), r.dead(), r.discarded()
	id := r.pending()

	res, err := r.st.ClaimBatch(r.ctx, 100, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	c := res.Claimed[0]
	require.Equal(t, id, c.MessageID)
	row := r.row(id)
	require.Equal(t, "claimed", row["status"])
	require.Equal(t, c.ClaimToken.String(), row["claim_token"])
	require.WithinDuration(t, time.Now().Add(time.Minute), c.LeaseUntil, 30*time.Second)

	// A live lease, and every later state, is not claimable.
	r.unchanged([]uuid.UUID{id, live.MessageID, dispatched, sent, dead, discarded}, func(uuid.UUID) {
		res, err := r.st.ClaimBatch(r.ctx, 100, time.Minute, store.OrderingRules{})
		require.NoError(t, err)
		require.Empty(t, res.Claimed)
	})

	// Once the lease has ended, a claim takes the row again under a new token.
	ok, err := r.st.RetryClaimAfter(r.ctx, c.ID, c.ClaimToken, 0)
	require.NoError(t, err)
	require.True(t, ok)
	res, err = r.st.ClaimBatch(r.ctx, 100, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, id, res.Claimed[0].MessageID)
	require.NotEqual(t, c.ClaimToken, res.Claimed[0].ClaimToken)
	require.Equal(t, res.Claimed[0].ClaimToken.String(), r.row(id)["claim_token"])
}

// claimed → dispatched, while the caller holds the claim: MarkDispatchedAll.
func TestTransitionMarkDispatched(t *testing.T) {
	r := newRowsIn(t)
	c, other := r.claimed(), r.claimed()
	dispatched, sent, dead := r.dispatched().MessageID, r.sent(), r.dead()

	n, err := r.st.MarkDispatchedAll(r.ctx, []store.Claimed{c})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	row := r.row(c.MessageID)
	require.Equal(t, "dispatched", row["status"])
	require.Nil(t, row["claim_token"])
	require.Nil(t, row["lease_until"])
	require.NotNil(t, row["dispatched_at"])

	// Another claim's token does not move a claimed row; nor does any token move a row in
	// another state.
	pending := r.pending()
	r.unchanged([]uuid.UUID{other.MessageID, c.MessageID, dispatched, sent, dead, pending}, func(id uuid.UUID) {
		row := r.row(id)
		n, err := r.st.MarkDispatchedAll(r.ctx, []store.Claimed{{ID: int64(row["id"].(float64)), ClaimToken: uuid.New()}})
		require.NoError(t, err)
		require.Zero(t, n)
	})
	n, err = r.st.MarkDispatchedAll(r.ctx, []store.Claimed{c}) // its own token, once dispatched
	require.NoError(t, err)
	require.Zero(t, n)
}

// pending, claimed or dispatched → sent: markSent, through RecordSent (and MarkSent).
func TestTransitionSent(t *testing.T) {
	r := newRowsIn(t)
	claimed, dispatched := r.claimed().MessageID, r.dispatched().MessageID
	sent, dead, discarded := r.sent(), r.dead(), r.discarded()
	pending := r.pending()

	for _, id := range []uuid.UUID{pending, claimed, dispatched} {
		s, err := r.st.RecordSent(r.ctx, id)
		require.NoError(t, err)
		require.NotNil(t, s)
		require.Equal(t, "order.created", s.Topic)
		require.Positive(t, s.Latency)
		row := r.row(id)
		require.Equal(t, "sent", row["status"])
		require.NotNil(t, row["sent_at"])
		require.Nil(t, row["claim_token"])
		require.Nil(t, row["lease_until"])
	}

	r.unchanged([]uuid.UUID{sent, dead, discarded, pending}, func(id uuid.UUID) { // pending is sent now
		s, err := r.st.RecordSent(r.ctx, id)
		require.NoError(t, err)
		require.Nil(t, s)
		ok, err := r.st.MarkSent(r.ctx, id)
		require.NoError(t, err)
		require.False(t, ok)
	})
}

// dispatched → sent, by reconciliation, only while the row is as it was read: markSent
// with the stillDispatched guard, through Repair, audited in the same transaction.
func TestTransitionRepairRecordedSent(t *testing.T) {
	r := newRowsIn(t)
	claimed, sent, dead := r.claimed().MessageID, r.sent(), r.dead()
	// Reading a dispatched row touches every dispatched row, so the rows it reads come last.
	stale := r.dispatched()
	fresh := r.readDispatched(stale.MessageID) // touches the row: stale's read is out of date

	r.unchanged([]uuid.UUID{stale.MessageID, claimed, sent, dead}, func(id uuid.UUID) {
		d := stale
		if id != stale.MessageID {
			d = r.asDispatched(id) // the row as it is now, but not dispatched
		}
		ok, err := r.st.Repair(r.ctx, d, store.ReconcileRecordedSent, "workflow completed")
		require.NoError(t, err)
		require.False(t, ok)
		require.Empty(t, r.audit(id))
	})

	ok, err := r.st.Repair(r.ctx, fresh, store.ReconcileRecordedSent, "workflow completed")
	require.NoError(t, err)
	require.True(t, ok)
	row := r.row(fresh.MessageID)
	require.Equal(t, "sent", row["status"])
	require.NotNil(t, row["sent_at"])
	audit := r.audit(fresh.MessageID)
	require.Len(t, audit, 1)
	require.Equal(t, "reconcile", audit[0].Action)
	require.Equal(t, "relay", audit[0].Actor)
	require.Equal(t, "recorded_sent: workflow completed", *audit[0].Detail)

	ok, err = r.st.Repair(r.ctx, fresh, store.ReconcileRecordedSent, "again")
	require.NoError(t, err)
	require.False(t, ok, "a repair happens once")
}

// dispatched → pending, by reconciliation, only while the row is as it was read:
// handOverAgain, through Repair, audited and notified in the same transaction.
func TestTransitionRepairHandedOverAgain(t *testing.T) {
	r := newRowsIn(t)
	claimed, sent, dead := r.claimed().MessageID, r.sent(), r.dead()
	stale := r.dispatched()
	fresh := r.readDispatched(stale.MessageID)

	r.unchanged([]uuid.UUID{stale.MessageID, claimed, sent, dead}, func(id uuid.UUID) {
		d := stale
		if id != stale.MessageID {
			d = r.asDispatched(id)
		}
		ok, err := r.st.Repair(r.ctx, d, store.ReconcileHandedOverAgain, "workflow not found")
		require.NoError(t, err)
		require.False(t, ok)
		require.Empty(t, r.audit(id))
	})

	listener, err := r.pool.Acquire(r.ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(r.ctx, `LISTEN `+pgx.Identifier{r.st.Channel()}.Sanitize())
	require.NoError(t, err)

	ok, err := r.st.Repair(r.ctx, fresh, store.ReconcileHandedOverAgain, "workflow not found")
	require.NoError(t, err)
	require.True(t, ok)
	row := r.row(fresh.MessageID)
	require.Equal(t, "pending", row["status"])
	require.NotNil(t, row["dispatched_at"], "the next run knows an earlier one may have sent it")
	require.Nil(t, row["next_retry_at"])
	audit := r.audit(fresh.MessageID)
	require.Len(t, audit, 1)
	require.Equal(t, "handed_over_again: workflow not found", *audit[0].Detail)

	waitCtx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	_, err = listener.Conn().WaitForNotification(waitCtx)
	require.NoError(t, err, "the relays are woken")

	res, err := r.st.ClaimBatch(r.ctx, 100, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.True(t, res.Claimed[0].MayHaveBeenSent())
}

// pending, claimed or dispatched → dead, with a dead letter: DeadLetter.
func TestTransitionDeadLetter(t *testing.T) {
	r := newRowsIn(t)
	claimed, dispatched := r.claimed().MessageID, r.dispatched().MessageID
	sent, dead, discarded := r.sent(), r.dead(), r.discarded()
	pending := r.pending()
	deadLetter := func(id uuid.UUID) (bool, error) {
		return r.st.DeadLetter(r.ctx, store.DeadLetter{MessageID: id, WorkflowID: "outbox-" + id.String(), RunID: "run-" + id.String(), Attempts: 5, LastError: "gave up"})
	}

	for _, id := range []uuid.UUID{pending, claimed, dispatched} {
		ok, err := deadLetter(id)
		require.NoError(t, err)
		require.True(t, ok)
		row := r.row(id)
		require.Equal(t, "dead", row["status"])
		require.Equal(t, "gave up", row["last_error"])
		require.Nil(t, row["claim_token"])
		letters, err := r.st.DeadLetters(r.ctx, id)
		require.NoError(t, err)
		require.Len(t, letters, 1)
	}

	// Sent and discarded rows are left alone and get no dead letter; a dead row gets the
	// dead letter of another run but stays as it is.
	r.unchanged([]uuid.UUID{sent, discarded}, func(id uuid.UUID) {
		ok, err := deadLetter(id)
		require.NoError(t, err)
		require.False(t, ok)
		letters, err := r.st.DeadLetters(r.ctx, id)
		require.NoError(t, err)
		require.Len(t, letters, map[uuid.UUID]int{sent: 0, discarded: 1}[id])
	})
	r.unchanged([]uuid.UUID{dead}, func(id uuid.UUID) {
		ok, err := deadLetter(id)
		require.NoError(t, err)
		require.False(t, ok)
	})
}

// dead → pending: Redrive.
func TestTransitionRedrive(t *testing.T) {
	r := newRowsIn(t)
	claimed, dispatched, sent, dead, discarded := r.claimed().MessageID, r.dispatched().MessageID, r.sent(), r.dead(), r.discarded()
	pending := r.pending()

	require.EqualValues(t, 3, r.row(dead)["retry_times"])
	red, err := r.st.Redrive(r.ctx, dead, "alice")
	require.NoError(t, err)
	require.Equal(t, 1, red.RedriveCount)
	row := r.row(dead)
	require.Equal(t, "pending", row["status"])
	require.EqualValues(t, 0, row["retry_times"])
	require.EqualValues(t, 1, row["redrive_count"])
	require.Nil(t, row["dispatched_at"])
	require.Equal(t, "redrive", r.audit(dead)[0].Action)

	r.unchanged([]uuid.UUID{dead, pending, claimed, dispatched, sent, discarded}, func(id uuid.UUID) {
		_, err := r.st.Redrive(r.ctx, id, "bob")
		var notDead *store.NotDeadError
		require.ErrorAs(t, err, &notDead)
	})
}

// dead → discarded: Discard.
func TestTransitionDiscard(t *testing.T) {
	r := newRowsIn(t)
	claimed, dispatched, sent, dead, discarded := r.claimed().MessageID, r.dispatched().MessageID, r.sent(), r.dead(), r.discarded()
	pending := r.pending()

	require.NoError(t, r.st.Discard(r.ctx, dead, "alice"))
	require.Equal(t, "discarded", r.row(dead)["status"])
	require.Equal(t, "discard", r.audit(dead)[0].Action)

	r.unchanged([]uuid.UUID{dead, pending, claimed, dispatched, sent, discarded}, func(id uuid.UUID) {
		var notDead *store.NotDeadError
		require.ErrorAs(t, r.st.Discard(r.ctx, id, "bob"), &notDead)
	})
}
