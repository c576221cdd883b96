package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// deadLettered enqueues a message and dead-letters it as a run would.
func deadLettered(t *testing.T, st *store.Store, topic, runID string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: topic, Payload: json.RawMessage(`{"n": 1}`)})
	require.NoError(t, err)
	// A run records its failed attempts before it gives up, so a redrive has them to reset.
	ok, err := st.RecordFailure(ctx, id, 4, "HTTP 500")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: topic, WorkflowID: "outbox-" + id.String(), RunID: runID, Attempts: 4, LastError: "gave up after 4 attempts: HTTP 500"})
	require.NoError(t, err)
	require.True(t, ok)
	return id
}

// status returns the message's status.
func status(t *testing.T, st *store.Store, id uuid.UUID) store.Status {
	t.Helper()
	row, err := st.Get(context.Background(), id)
	require.NoError(t, err)
	return row.Status
}

func TestDeadLetterOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ListFilters", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		a := deadLettered(t, st, "order.created", "r1")
		b := deadLettered(t, st, "order.paid", "r1")
		c := deadLettered(t, st, "order.created", "r1")
		_, err := pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_dead_letters SET dead_lettered_at = now() - interval '2 days' WHERE message_id = $1`, a)
		require.NoError(t, err)

		all, err := st.ListDeadLetters(ctx, store.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, all, 3)
		require.Equal(t, a, all[2].MessageID, "newest first")

		byTopic, err := st.ListDeadLetters(ctx, store.DeadLetterFilter{Topic: "order.created"})
		require.NoError(t, err)
		require.Len(t, byTopic, 2)

		recent, err := st.ListDeadLetters(ctx, store.DeadLetterFilter{Since: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
		require.ElementsMatch(t, []uuid.UUID{b, c}, []uuid.UUID{recent[0].MessageID, recent[1].MessageID})

		limited, err := st.ListDeadLetters(ctx, store.DeadLetterFilter{Limit: 1})
		require.NoError(t, err)
		require.Len(t, limited, 1)

		_, err = st.Redrive(ctx, b, "alice")
		require.NoError(t, err)
		open, err := st.ListDeadLetters(ctx, store.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, open, 2, "a redriven dead letter is closed")
		closed, err := st.ListDeadLetters(ctx, store.DeadLetterFilter{IncludeClosed: true})
		require.NoError(t, err)
		require.Len(t, closed, 3)
	})

	t.Run("RedriveResetsAndAudits", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		require.NoError(t, st.SetNotify(ctx, true)) // the insert below notifies too
		listener, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer listener.Release()
		_, err = listener.Exec(ctx, `LISTEN `+pgx.Identifier{st.Channel()}.Sanitize())
		require.NoError(t, err)

		id := deadLettered(t, st, "order.created", "run-1")
		// Drain the notification of the insert.
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = listener.Conn().WaitForNotification(waitCtx)
		require.NoError(t, err)

		r, err := st.Redrive(ctx, id, "alice")
		require.NoError(t, err)
		require.Equal(t, store.Redriven{MessageID: id, Topic: "order.created", RedriveCount: 1}, r)
		_, err = listener.Conn().WaitForNotification(waitCtx)
		require.NoError(t, err, "a redrive wakes the relays")

		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusPending, row.Status)
		require.Equal(t, 0, row.RetryTimes)
		require.Equal(t, 1, row.RedriveCount)
		dls, err := st.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.NotNil(t, dls[0].RedrivenAt)
		require.Equal(t, "alice", *dls[0].RedrivenBy)

		// Dead again in a second run, redriven again: two dead letters, two redrives.
		_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'dispatched' WHERE message_id = $1`, id)
		require.NoError(t, err)
		ok, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "order.created", WorkflowID: "w", RunID: "run-2", Attempts: 1, LastError: "x"})
		require.NoError(t, err)
		require.True(t, ok)
		r, err = st.Redrive(ctx, id, "bob")
		require.NoError(t, err)
		require.Equal(t, 2, r.RedriveCount)
		dls, err = st.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dls, 2)
		audit, err := st.Audit(ctx, id)
		require.NoError(t, err)
		require.Len(t, audit, 2)
		require.Equal(t, "alice", audit[0].Actor)
		require.Equal(t, "bob", audit[1].Actor)
		require.Equal(t, dls[1].ID, *audit[1].DeadLetterID)
	})

	t.Run("RedriveOfWhatIsNotDeadIsAClearError", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: "t", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		_, err = st.Redrive(ctx, id, "alice")
		var notDead *store.NotDeadError
		require.ErrorAs(t, err, &notDead)
		require.Equal(t, store.StatusPending, notDead.Status)
		require.Contains(t, err.Error(), "is pending, not dead")

		_, err = st.MarkSent(ctx, id)
		require.NoError(t, err)
		err = st.Discard(ctx, id, "alice")
		require.ErrorAs(t, err, &notDead)
		require.Contains(t, err.Error(), "is sent, not dead")

		_, err = st.Redrive(ctx, uuid.New(), "alice")
		require.True(t, errors.Is(err, store.ErrNotFound))
		_, err = st.Redrive(ctx, id, " ")
		require.ErrorContains(t, err, "actor")
	})

	t.Run("ConcurrentRedrivesStartOneDelivery", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		id := deadLettered(t, st, "t", "run-1")
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ok, notDead int
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := st.Redrive(ctx, id, "op")
				mu.Lock()
				defer mu.Unlock()
				var nd *store.NotDeadError
				switch {
				case err == nil:
					ok++
				case errors.As(err, &nd):
					notDead++
				default:
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, ok)
		require.Equal(t, 7, notDead)
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, row.RedriveCount)
		claimed, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
	})

	// An operator's action on the dead letter a list showed waits for another operator's
	// change in flight on the same message, then sees it: the other operator redrove the
	// message and its new run dead-lettered it again, so the letter the list showed is no
	// longer open, and nothing is done.
	t.Run("ActionOnASelectedLetterWaitsForAChangeInFlight", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		id := deadLettered(t, st, "t", "run-1")
		dls, err := st.DeadLetters(ctx, id)
		require.NoError(t, err)
		selected := dls[0].ID

		other, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = other.Rollback(ctx) }()
		for _, q := range []string{
			`UPDATE ` + st.Schema() + `.outbox_messages SET redrive_count = redrive_count + 1, last_error = 'HTTP 422', updated_at = now() WHERE message_id = $1`,
			`UPDATE ` + st.Schema() + `.outbox_dead_letters SET redriven_at = now(), redriven_by = 'bob' WHERE message_id = $1`,
			`INSERT INTO ` + st.Schema() + `.outbox_dead_letters (message_id, workflow_id, run_id, topic, payload, attempts, last_error)
VALUES ($1, 'outbox-run-2', 'run-2', 't', '{}', 1, 'HTTP 422')`,
		} {
			_, err := other.Exec(ctx, q, id)
			require.NoError(t, err)
		}

		done := make(chan error, 1)
		go func() {
			_, err := st.RedriveDeadLetter(ctx, id, selected, "alice")
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("the redrive did not wait for the change in flight: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(t, other.Commit(ctx))
		err = <-done
		var changed *store.DeadLetterChangedError
		require.ErrorAs(t, err, &changed)
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusDead, row.Status)
		require.Equal(t, 1, row.RedriveCount, "bob's redrive only")
		dls, err = st.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dls, 2)
		require.Nil(t, dls[1].RedrivenAt, "the new letter stays open")
		audit, err := st.Audit(ctx, id)
		require.NoError(t, err)
		require.Empty(t, audit)
	})

	t.Run("SameRunDeadLetteringAgainAfterRedriveIsANoOp", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		id := deadLettered(t, st, "t", "run-1")
		_, err := st.Redrive(ctx, id, "op")
		require.NoError(t, err)
		// The run that dead-lettered it had not closed yet and runs its dead-letter step
		// again (its first completion was lost, or its worker replayed it): that step is
		// done, and the redrive stands.
		ok, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "t", WorkflowID: "w", RunID: "run-1", Attempts: 4, LastError: "again"})
		require.NoError(t, err)
		require.False(t, ok, "the row does not move")
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusPending, row.Status)
		require.Equal(t, 1, row.RedriveCount)
		dls, err := st.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.NotNil(t, dls[0].RedrivenAt, "the dead letter stays redriven")
		require.Equal(t, "op", *dls[0].RedrivenBy)
		open, err := st.ListDeadLetters(ctx, store.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, open)

		// Also when the row was handed over again meanwhile.
		claimed, err := st.Claim(ctx, 1, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		ok, err = st.MarkDispatched(ctx, claimed[0].ID, claimed[0].ClaimToken)
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "t", WorkflowID: "w", RunID: "run-1", Attempts: 4, LastError: "again"})
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, store.StatusDispatched, status(t, st, id))

		// A later run that gives up dead-letters it again.
		ok, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "t", WorkflowID: "w", RunID: "run-2", Attempts: 4, LastError: "second run"})
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, store.StatusDead, status(t, st, id))
		open, err = st.ListDeadLetters(ctx, store.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, open, 1)
		require.Equal(t, "run-2", open[0].RunID)
	})

	t.Run("SameRunDeadLetteringAgainAfterDiscardIsANoOp", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		id := deadLettered(t, st, "t", "run-1")
		require.NoError(t, st.Discard(ctx, id, "op"))
		ok, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "t", WorkflowID: "w", RunID: "run-1", Attempts: 4, LastError: "again"})
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, store.StatusDiscarded, status(t, st, id))
		dls, err := st.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.NotNil(t, dls[0].DiscardedAt)
		require.Nil(t, dls[0].RedrivenAt)
	})

	t.Run("DeadLetterRunIDs", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		fresh, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: "t", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		runs, err := st.DeadLetterRunIDs(ctx, fresh)
		require.NoError(t, err)
		require.Empty(t, runs)

		id := deadLettered(t, st, "t", "run-1")
		runs, err = st.DeadLetterRunIDs(ctx, id)
		require.NoError(t, err)
		require.Equal(t, []string{"run-1"}, runs)
		// Redriven, and dead-lettered by a second run: both runs, the redriven one too.
		_, err = st.Redrive(ctx, id, "op")
		require.NoError(t, err)
		ok, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "t", WorkflowID: "w", RunID: "run-2", Attempts: 1, LastError: "x"})
		require.NoError(t, err)
		require.True(t, ok)
		runs, err = st.DeadLetterRunIDs(ctx, id)
		require.NoError(t, err)
		require.Equal(t, []string{"run-1", "run-2"}, runs)
		runs, err = st.DeadLetterRunIDs(ctx, fresh)
		require.NoError(t, err)
		require.Empty(t, runs, "another message's dead letters are not its own")
	})

	t.Run("Discard", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		id := deadLettered(t, st, "t", "run-1")
		require.NoError(t, st.Discard(ctx, id, "carol"))
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusDiscarded, row.Status)
		dls, err := st.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "carol", *dls[0].DiscardedBy)
		_, err = st.Redrive(ctx, id, "carol")
		var notDead *store.NotDeadError
		require.ErrorAs(t, err, &notDead)
		claimed, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, claimed)
	})
}

func TestStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)

	empty, err := st.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, empty.ByStatus[store.StatusPending])
	require.Zero(t, empty.OldestPendingAge)

	enqueue := func(topic string) uuid.UUID {
		id, err := st.Enqueue(ctx, pool, store.Message{Topic: topic, Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return id
	}
	old := enqueue("a")
	enqueue("a")
	enqueue("b")
	_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET created_at = now() - interval '90 seconds' WHERE message_id = $1`, old)
	require.NoError(t, err)
	sent := enqueue("b")
	_, err = st.MarkSent(ctx, sent)
	require.NoError(t, err)
	dispatched := enqueue("a")
	// Handed over an hour ago; reconciliation checked it just now (updated_at), which must
	// not make the stuck delivery look young.
	_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'dispatched', dispatched_at = now() - interval '1 hour', updated_at = now() WHERE message_id = $1`, dispatched)
	require.NoError(t, err)
	deadLettered(t, st, "b", "r")
	gone := deadLettered(t, st, "b", "r")
	require.NoError(t, st.Discard(ctx, gone, "op"))
	oldDead := deadLettered(t, st, "a", "r")
	_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_dead_letters SET dead_lettered_at = now() - interval '3 hours' WHERE message_id = $1`, oldDead)
	require.NoError(t, err)

	s, err := st.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, map[store.Status]int64{
		store.StatusPending: 3, store.StatusClaimed: 0, store.StatusDispatched: 1, store.StatusSent: 1, store.StatusDead: 2, store.StatusDiscarded: 1,
	}, s.ByStatus)
	require.Equal(t, map[string]map[store.Status]int64{
		"a": {store.StatusPending: 2, store.StatusDispatched: 1, store.StatusDead: 1},
		"b": {store.StatusPending: 1, store.StatusSent: 1, store.StatusDead: 1, store.StatusDiscarded: 1},
	}, s.ByTopic)
	require.Equal(t, int64(1), s.InFlight)
	require.InDelta(t, 90, s.OldestPendingAge.Seconds(), 30)
	require.InDelta(t, 3600, s.OldestInFlightAge.Seconds(), 60)
	require.Equal(t, int64(2), s.OpenDeadLetters)
	require.Equal(t, int64(2), s.DeadLettersLastHour)
	require.Equal(t, int64(3), s.DeadLettersLastDay)

	// The numbers match the table.
	var pending int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Schema()+`.outbox_messages WHERE status = 'pending'`).Scan(&pending))
	require.Equal(t, pending, s.ByStatus["pending"])
}
