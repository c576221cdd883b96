package starter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// deliverer stands in for Temporal and the receiver: each start is "delivered" after a
// random delay (so deliveries of different messages overlap and would reorder if the
// relay let them), recorded per key, and marked sent, which releases the key's next
// message.
type deliverer struct {
	st        *store.Store
	mu        sync.Mutex
	delivered map[string][]int64 // ordering key → ordering_seq in delivery order
	count     map[uuid.UUID]int
	inFlight  map[string]bool // key → a delivery of it is in progress
	overlap   []string
	wg        sync.WaitGroup
}

func (d *deliverer) ExecuteWorkflow(_ context.Context, opts client.StartWorkflowOptions, _ any, args ...any) (client.WorkflowRun, error) {
	in := args[0].(workflows.DeliveryInput)
	id := uuid.MustParse(in.MessageID)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		row, err := d.st.Get(context.Background(), id)
		if err != nil {
			panic(err)
		}
		key, seq := "", int64(0) // a message without a key
		if row.OrderingKey != nil {
			key, seq = *row.OrderingKey, *row.OrderingSeq
		}
		d.mu.Lock()
		if key != "" && d.inFlight[key] {
			d.overlap = append(d.overlap, key)
		}
		d.inFlight[key] = true
		d.mu.Unlock()
		// Deliveries take a while, some longer than others, so that they overlap.
		time.Sleep(time.Duration(id[15]%30) * 100 * time.Microsecond)
		d.mu.Lock()
		d.delivered[key] = append(d.delivered[key], seq)
		d.count[id]++
		d.inFlight[key] = false
		d.mu.Unlock()
		if _, err := d.st.MarkSent(context.Background(), id); err != nil {
			panic(err)
		}
	}()
	return nil, nil
}

func (d *deliverer) DescribeWorkflowExecution(context.Context, string, string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	return nil, errors.New("not used: every start succeeds")
}

// TestOrdering: many writers enqueue interleaved messages for a few keys in overlapping
// transactions, some committing late and some rolling back, while two relays run; each
// key's messages reach the receiver in the order of the sequence numbers the committed
// Enqueues returned, all of them, none twice.
func TestOrdering(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		t.Run(fmt.Sprintf("Round%d", round), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, st := testdb.Schema(t)
			d := &deliverer{st: st, delivered: map[string][]int64{}, count: map[uuid.UUID]int{}, inFlight: map[string]bool{}}
			runCtx, cancel := context.WithCancel(ctx)
			var relays sync.WaitGroup
			for range 2 {
				r, err := starter.New(st, pool, d, starter.Config{PollInterval: 20 * time.Millisecond, Lease: 30 * time.Second, BatchSize: 10})
				require.NoError(t, err)
				relays.Add(1)
				go func() { defer relays.Done(); _ = r.Run(runCtx) }()
			}

			keys := []string{"order-1", "order-2", "order-3", "order-4"}
			var (
				mu        sync.Mutex
				committed = map[string][]int64{}
				unordered []uuid.UUID
				writers   sync.WaitGroup
			)
			seed := testutil.Seed(t)
			for w := range 8 {
				writers.Add(1)
				go func() {
					defer writers.Done()
					rand := rand.New(rand.NewPCG(seed, uint64(w)))
					for i := range 25 {
						key := keys[rand.IntN(len(keys))]
						rollback := rand.IntN(7) == 0
						late := rand.IntN(5) == 0
						var res store.Enqueued
						err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
							var err error
							res, err = st.EnqueueMessage(ctx, tx, store.Message{
								Topic: "order.event", OrderingKey: key,
								Payload: json.RawMessage(fmt.Sprintf(`{"writer": %d, "i": %d}`, w, i)),
							})
							if err != nil {
								return err
							}
							if late {
								time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
							}
							if rollback {
								return errRollback
							}
							return nil
						})
						if errors.Is(err, errRollback) {
							continue
						}
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						committed[key] = append(committed[key], res.OrderingSeq)
						mu.Unlock()
						if i%10 == 0 { // messages without a key are never held back
							id, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.event", Payload: json.RawMessage(`{}`)})
							if err != nil {
								t.Error(err)
								return
							}
							mu.Lock()
							unordered = append(unordered, id)
							mu.Unlock()
						}
					}
				}()
			}
			writers.Wait()

			total := 0
			for _, seqs := range committed {
				total += len(seqs)
			}
			total += len(unordered)
			require.Eventually(t, func() bool {
				var sent int
				require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Schema()+`.outbox_messages WHERE status = 'sent'`).Scan(&sent))
				return sent == total
			}, 60*time.Second, 20*time.Millisecond)
			cancel()
			relays.Wait()
			d.wg.Wait()

			d.mu.Lock()
			defer d.mu.Unlock()
			require.Empty(t, d.overlap, "two messages of one key were in delivery at once")
			for _, key := range keys {
				want := slices.Clone(committed[key])
				slices.Sort(want)
				require.Len(t, slices.Compact(slices.Clone(want)), len(want), "key %s: every committed message has its own number", key)
				require.Equal(t, want, d.delivered[key], "key %s delivered in commit order", key)
			}
			for id, n := range d.count {
				require.Equal(t, 1, n, "message %s delivered %d times", id, n)
			}
		})
	}
}

var errRollback = errors.New("roll back")

func TestOrderingDeadLetterBlocksOnlyItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	enqueue := func(t *testing.T, st *store.Store, topic, key string) uuid.UUID {
		res, err := st.EnqueueMessage(ctx, st.DB(), store.Message{Topic: topic, OrderingKey: key, Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return res.MessageID
	}
	claimIDs := func(t *testing.T, st *store.Store, rules store.OrderingRules) []uuid.UUID {
		res, err := st.ClaimBatch(ctx, 100, time.Minute, rules)
		require.NoError(t, err)
		var ids []uuid.UUID
		for _, c := range res.Claimed {
			ids = append(ids, c.MessageID)
		}
		return ids
	}
	deadLetter := func(t *testing.T, st *store.Store, id uuid.UUID, topic string) {
		ok, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: topic, WorkflowID: "w", RunID: uuid.NewString(), Attempts: 1, LastError: "HTTP 400"})
		require.NoError(t, err)
		require.True(t, ok)
	}

	t.Run("BlocksUntilRedriven", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		a1 := enqueue(t, st, "order.created", "A")
		a2 := enqueue(t, st, "order.paid", "A")
		b1 := enqueue(t, st, "order.created", "B")
		plain := enqueue(t, st, "order.created", "")
		require.ElementsMatch(t, []uuid.UUID{a1, b1, plain}, claimIDs(t, st, store.OrderingRules{}))
		deadLetter(t, st, a1, "order.created")
		_, err := st.MarkSent(ctx, b1)
		require.NoError(t, err)
		require.Empty(t, claimIDs(t, st, store.OrderingRules{}), "a2 waits behind the dead a1")

		s, err := st.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), s.HeldBack)
		require.Equal(t, int64(1), s.KeysBlockedByDead)

		_, err = st.Redrive(ctx, a1, "op")
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{a1}, claimIDs(t, st, store.OrderingRules{}), "the redriven a1 goes first")
		_, err = st.MarkSent(ctx, a1)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{a2}, claimIDs(t, st, store.OrderingRules{}))

	})

	t.Run("DiscardReleasesTheKey", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		a1 := enqueue(t, st, "order.created", "A")
		a2 := enqueue(t, st, "order.created", "A")
		require.Equal(t, []uuid.UUID{a1}, claimIDs(t, st, store.OrderingRules{}))
		deadLetter(t, st, a1, "order.created")
		require.Empty(t, claimIDs(t, st, store.OrderingRules{}))
		require.NoError(t, st.Discard(ctx, a1, "op"))
		require.Equal(t, []uuid.UUID{a2}, claimIDs(t, st, store.OrderingRules{}))
	})

	t.Run("SkippingTopic", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		a1 := enqueue(t, st, "audit.log", "A")
		a2 := enqueue(t, st, "audit.log", "A")
		rules := store.OrderingRules{Listed: []string{"audit.log"}, Skipping: []string{"audit.log"}}
		require.Equal(t, []uuid.UUID{a1}, claimIDs(t, st, rules))
		deadLetter(t, st, a1, "audit.log")
		require.Equal(t, []uuid.UUID{a2}, claimIDs(t, st, rules), "a dead message of a skipping topic does not block")
	})

	t.Run("UnorderedTopic", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		a1 := enqueue(t, st, "metrics.tick", "A")
		a2 := enqueue(t, st, "metrics.tick", "A")
		rules := store.OrderingRules{DefaultUnordered: true}
		require.ElementsMatch(t, []uuid.UUID{a1, a2}, claimIDs(t, st, rules))
	})
}
