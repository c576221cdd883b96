package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/store"
)

// positions returns each message's place in the order the receiver processed them.
func positions(r *testutil.Receiver) map[uuid.UUID]int {
	pos := map[uuid.UUID]int{}
	for i, id := range r.Arrivals() {
		pos[uuid.MustParse(id)] = i
	}
	return pos
}

// orderedEnv is an env with an ordered topic, one worker and two relays (as several
// replicas run): each key's order must hold whichever relay claims its messages.
func orderedEnv(t *testing.T) (*env, *testutil.Receiver) {
	t.Helper()
	ts := newServer(t)
	e := newEnv(t, ts)
	r := newReceiver(t)
	e.cfg.Topics["order.event"] = config.Topic{Sink: "http", URL: r.URL + "/events",
		InitialInterval: config.Duration(50 * time.Millisecond), MaxInterval: config.Duration(200 * time.Millisecond)}
	e.startWorker(t)
	e.startRelay(t)
	e.startRelay(t)
	return e, r
}

// TestOrderingEndToEnd: writers in overlapping transactions (some rolled back) enqueue
// messages for a few keys; each key's messages reach the receiver in the order of their
// sequence numbers, each once.
func TestOrderingEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, recv := orderedEnv(t)
	keys := []string{"order-1", "order-2", "order-3"}
	var (
		mu        sync.Mutex
		committed = map[string][]store.Enqueued{}
		wg        sync.WaitGroup
	)
	seed := testutil.Seed(t)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rand := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range 15 {
				key := keys[rand.IntN(len(keys))]
				rollback := rand.IntN(6) == 0
				var res store.Enqueued
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					var err error
					res, err = e.store.EnqueueMessage(ctx, tx, store.Message{Topic: "order.event", OrderingKey: key,
						Payload: json.RawMessage(fmt.Sprintf(`{"writer": %d, "i": %d}`, w, i))})
					if err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
					if rollback {
						return errRolledBack
					}
					return nil
				})
				if err == errRolledBack {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				committed[key] = append(committed[key], res)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, list := range committed {
		for _, m := range list {
			e.waitStatus(t, m.MessageID, store.StatusSent)
		}
	}
	pos := positions(recv)
	for key, list := range committed {
		slices.SortFunc(list, func(a, b store.Enqueued) int { return int(a.OrderingSeq - b.OrderingSeq) })
		for i := 1; i < len(list); i++ {
			require.Less(t, pos[list[i-1].MessageID], pos[list[i].MessageID], "key %s: seq %d arrived after seq %d", key, list[i-1].OrderingSeq, list[i].OrderingSeq)
		}
	}
	for id, n := range recv.Snapshot().Requests {
		require.Equal(t, 1, n, "message %s received %d times", id, n)
	}
}

var errRolledBack = fmt.Errorf("rolled back")

// TestPoisonedKey: a dead message blocks only its own key; a redrive releases the key in
// order.
func TestPoisonedKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, recv := orderedEnv(t)
	enqueue := func(key string) uuid.UUID {
		res, err := e.store.EnqueueMessage(ctx, e.pool, store.Message{Topic: "order.event", OrderingKey: key, Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return res.MessageID
	}
	// a1 is poisoned before it is committed, so its first delivery fails.
	a1 := uuid.Must(uuid.NewV7())
	recv.Reject(a1.String(), http.StatusBadRequest)
	_, err := e.store.EnqueueMessage(ctx, e.pool, store.Message{MessageID: a1, Topic: "order.event", OrderingKey: "A", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	a2, a3 := enqueue("A"), enqueue("A")
	b1, b2 := enqueue("B"), enqueue("B")
	plain := enqueue("")

	e.waitStatus(t, a1, store.StatusDead)
	for _, id := range []uuid.UUID{b1, b2, plain} {
		e.waitStatus(t, id, store.StatusSent)
	}
	// Key A stays blocked: a relay's claim finds a2 and a3 behind the dead a1 and parks
	// them, and they stay pending.
	require.Eventually(t, func() bool {
		var parked int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.store.Schema()+`.outbox_messages
			WHERE message_id = ANY($1) AND held_back`, []uuid.UUID{a2, a3}).Scan(&parked))
		return parked == 2
	}, 30*time.Second, 20*time.Millisecond, "the relay never parked a2 and a3 behind the dead a1")
	require.Equal(t, store.StatusPending, e.status(t, a2))
	require.Equal(t, store.StatusPending, e.status(t, a3))
	s, err := e.store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), s.HeldBack)
	require.Equal(t, int64(1), s.KeysBlockedByDead)

	recv.Reject(a1.String(), 0)
	_, err = e.store.Redrive(ctx, a1, "e2e")
	require.NoError(t, err)
	for _, id := range []uuid.UUID{a1, a2, a3} {
		e.waitStatus(t, id, store.StatusSent)
	}
	pos := positions(recv)
	require.Less(t, pos[a1], pos[a2])
	require.Less(t, pos[a2], pos[a3])
	require.Less(t, pos[b1], pos[b2])
}
