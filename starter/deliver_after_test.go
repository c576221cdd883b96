package starter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// claimCountingDB is the relay's store database, counting the claims run through it and,
// when told, failing the store's NextDue query. It knows the two statements by what only
// they say: the claim sets status claimed, NextDue subtracts now() from the earliest
// next_retry_at.
type claimCountingDB struct {
	*pgxpool.Pool
	claims      atomic.Int64
	failNextDue atomic.Bool
}

func (d *claimCountingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "SET status = 'claimed',") {
		d.claims.Add(1)
	}
	return d.Pool.Query(ctx, sql, args...)
}

func (d *claimCountingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.Contains(sql, "min(next_retry_at) - now()") && d.failNextDue.Load() {
		return failedRow{errors.New("next due: connection reset")}
	}
	return d.Pool.QueryRow(ctx, sql, args...)
}

type failedRow struct{ err error }

func (r failedRow) Scan(...any) error { return r.err }

// logBuffer collects a logger's output for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// delayedSetup returns a store whose claims are counted, and runs a relay on it until the
// test ends, once the relay listens for notifications (relay.wakeup: notify) and has
// settled.
func delayedSetup(t *testing.T, rec *recorder, cfg starter.Config) (*store.Store, *claimCountingDB) {
	t.Helper()
	ctx := context.Background()
	pool, base := testdb.Schema(t)
	require.NoError(t, base.SetNotify(ctx, true))
	cfg.Wakeup = starter.WakeupNotify
	db := &claimCountingDB{Pool: pool}
	st, err := store.New(db, store.Config{Schema: base.Schema()})
	require.NoError(t, err)
	r, err := starter.New(st, pool, rec, cfg)
	require.NoError(t, err)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("relay did not stop")
		}
	})

	listen := "LISTEN " + pgx.Identifier{st.Channel()}.Sanitize()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'idle'`, listen).Scan(&n))
		return n == 1
	}, 10*time.Second, 20*time.Millisecond, "the relay never listened")
	settle(t, db)
	return st, db
}

// settle waits until the relay has run no claim for a while.
func settle(t *testing.T, db *claimCountingDB) {
	t.Helper()
	last := int64(-1)
	require.Eventually(t, func() bool {
		n := db.claims.Load()
		quiet := n == last
		last = n
		return quiet
	}, 10*time.Second, 200*time.Millisecond, "the relay kept claiming")
}

func enqueueAt(t *testing.T, st *store.Store, at time.Time) {
	t.Helper()
	_, err := st.Enqueue(context.Background(), st.DB(), store.Message{Topic: "t", Payload: json.RawMessage(`{}`), DeliverAfter: at})
	require.NoError(t, err)
}

func TestRelayDeliverAfter(t *testing.T) {
	t.Parallel()

	t.Run("StartsWhenDueWithoutPolling", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		var mu sync.Mutex
		startedAt := map[string]time.Time{}
		claimsAtStart := map[string]int64{}
		var db *claimCountingDB
		rec.startErr = func(id string) error {
			mu.Lock()
			defer mu.Unlock()
			startedAt[id] = time.Now()
			// The claims up to the start: the relay may claim again right after it (the
			// start's own row update wakes it).
			claimsAtStart[id] = db.claims.Load()
			return nil
		}
		st, counting := delayedSetup(t, rec, starter.Config{PollInterval: time.Hour})
		mu.Lock()
		db = counting
		mu.Unlock()

		// A message an hour ahead: the relay wakes on its notification and goes back to
		// sleep, at most until the poll.
		enqueueAt(t, st, time.Now().Add(time.Hour))
		settle(t, db)

		// A message two seconds ahead: its notification makes the relay recompute.
		before := db.claims.Load()
		at := time.Now().Add(2 * time.Second)
		id, err := st.Enqueue(context.Background(), st.DB(), store.Message{Topic: "t", Payload: json.RawMessage(`{}`), DeliverAfter: at})
		require.NoError(t, err)
		select {
		case got := <-rec.started:
			require.Equal(t, workflows.WorkflowID(id.String()), got)
		case <-time.After(10 * time.Second):
			t.Fatal("the delayed message was not started")
		}
		row, err := st.Get(context.Background(), id)
		require.NoError(t, err)
		require.NotNil(t, row.NextRetryAt)
		mu.Lock()
		started := startedAt[workflows.WorkflowID(id.String())]
		claims := claimsAtStart[workflows.WorkflowID(id.String())] - before
		mu.Unlock()
		t.Logf("started %s after its time, %d claims since the enqueue", started.Sub(at), claims)
		require.False(t, started.Before(*row.NextRetryAt), "started at %s, before its time %s", started, row.NextRetryAt)
		// With an hour between polls, the start within the 10s above came from a wake at
		// the due time: the wake on the insert's notification, that wake, and one pass of
		// slack.
		require.GreaterOrEqual(t, claims, int64(1))
		require.LessOrEqual(t, claims, int64(3), "claims between the enqueue and the start")
		require.Empty(t, rec.started, "the message an hour ahead is not started")
	})

	t.Run("NextDueFailureFallsBackToPollInterval", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		logs := &logBuffer{}
		st, db := delayedSetup(t, rec, starter.Config{
			PollInterval: time.Hour,
			Logger:       slog.New(slog.NewTextHandler(logs, nil)),
		})
		db.failNextDue.Store(true)

		// Without NextDue the delayed message waits for the poll or a notification, and
		// the relay does not spin meanwhile.
		enqueueAt(t, st, time.Now().Add(200*time.Millisecond))
		before := db.claims.Load()
		require.Never(t, func() bool { return len(rec.started) > 0 }, time.Second, 50*time.Millisecond)
		require.LessOrEqual(t, db.claims.Load()-before, int64(1))
		require.Contains(t, logs.String(), "level=WARN")
		require.Contains(t, logs.String(), "Cannot read when the next delayed message is due")

		// The next notification claims it, now that it is due.
		id := enqueue(t, st, "t", nil)
		got := map[string]bool{}
		for len(got) < 2 {
			select {
			case wid := <-rec.started:
				got[wid] = true
			case <-time.After(10 * time.Second):
				t.Fatalf("started only %v", got)
			}
		}
		require.True(t, got[workflows.WorkflowID(id.String())])
	})
}
