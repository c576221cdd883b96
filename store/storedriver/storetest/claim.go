package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testClaim pins the relay's claim: it leases due rows under a token, never gives one row
// to two claimers while the lease lasts, takes a row again once its lease has ended, and
// MarkDispatchedAll and RetryClaimAfter act only for the holder of the claim.
func testClaim(t *testing.T, h Harness) {
	t.Run("LeasesDueRows", func(t *testing.T) {
		e := newEnv(t, h)
		_, err := e.d().ClaimBatch(e.ctx, 0, time.Minute, storedriver.OrderingRules{})
		require.Error(t, err, "a limit below 1 is refused")
		empty := e.claim(10, storedriver.OrderingRules{})
		require.Empty(t, empty.Claimed)
		require.Zero(t, empty.Parked)

		var msgs []storedriver.Message
		for i := range 5 {
			msgs = append(msgs, msg("order.created", fmt.Sprintf(`{"i": %d}`, i)))
		}
		ids := map[uuid.UUID]bool{}
		for _, r := range e.enqueue(msgs...) {
			ids[r.MessageID] = true
		}

		res := e.claim(2, storedriver.OrderingRules{})
		require.Len(t, res.Claimed, 2, "at most the limit")
		rest := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, rest.Claimed, 3)
		for _, c := range append(res.Claimed, rest.Claimed...) {
			require.True(t, ids[c.MessageID], "claimed a row it did not enqueue: %s", c.MessageID)
			delete(ids, c.MessageID)
			require.Equal(t, "order.created", c.Topic)
			require.NotZero(t, c.ID)
			require.NotEqual(t, uuid.Nil, c.ClaimToken)
			require.WithinDuration(t, time.Now().Add(time.Minute), c.LeaseUntil, 30*time.Second, "lease_until by the database clock")
			require.WithinDuration(t, time.Now(), c.CreatedAt, time.Minute)
			require.Zero(t, c.RetryTimes)
			require.Nil(t, c.MaxRetryTimes)
			require.Zero(t, c.RedriveCount)
			require.Nil(t, c.DispatchedAt)
			require.False(t, c.MayHaveBeenSent())
			row := e.get(c.MessageID)
			require.Equal(t, storedriver.StatusClaimed, row.Status)
			require.Equal(t, c.ID, row.ID)
		}
		require.Empty(t, ids, "every row claimed once")

		again := e.claim(10, storedriver.OrderingRules{})
		require.Empty(t, again.Claimed, "a live lease is not claimable")
	})

	t.Run("ConcurrentClaimersTakeDisjointRows", func(t *testing.T) {
		e := newEnv(t, h)
		const total = 200
		var msgs []storedriver.Message
		for i := range total {
			msgs = append(msgs, msg("t", fmt.Sprintf(`{"i": %d}`, i)))
		}
		e.enqueue(msgs...)
		var (
			mu   sync.Mutex
			seen = map[int64]int{}
			wg   sync.WaitGroup
		)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					res, err := e.d().ClaimBatch(e.ctx, 7, time.Minute, storedriver.OrderingRules{})
					if err != nil {
						t.Error(err)
						return
					}
					if len(res.Claimed) == 0 {
						return
					}
					mu.Lock()
					for _, c := range res.Claimed {
						seen[c.ID]++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.Len(t, seen, total, "every row claimed")
		for id, n := range seen {
			require.Equal(t, 1, n, "row %d claimed %d times", id, n)
		}
		st, err := e.d().Stats(e.ctx)
		require.NoError(t, err)
		require.EqualValues(t, total, st.ByStatus[storedriver.StatusClaimed])
	})

	t.Run("ExpiredLeaseIsClaimableAgain", func(t *testing.T) {
		e := newEnv(t, h)
		first := e.claimed("t")
		e.shift("lease_until", first.ID)
		res := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, res.Claimed, 1)
		second := res.Claimed[0]
		require.Equal(t, first.ID, second.ID)
		require.Equal(t, first.MessageID, second.MessageID)
		require.NotEqual(t, first.ClaimToken, second.ClaimToken)
		require.True(t, second.LeaseUntil.After(time.Now()))

		n, err := e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{first})
		require.NoError(t, err)
		require.Zero(t, n, "the first claimer lost its lease")
		ok, err := e.d().RetryClaimAfter(e.ctx, first.ID, first.ClaimToken, 0)
		require.NoError(t, err)
		require.False(t, ok, "the first claimer lost its lease")
		e.dispatch(second)
	})

	t.Run("RetryClaimAfter", func(t *testing.T) {
		e := newEnv(t, h)
		c := e.claimed("t")
		ok, err := e.d().RetryClaimAfter(e.ctx, c.ID, uuid.New(), 0)
		require.NoError(t, err)
		require.False(t, ok, "only the holder of the claim")

		ok, err = e.d().RetryClaimAfter(e.ctx, c.ID, c.ClaimToken, time.Hour)
		require.NoError(t, err)
		require.True(t, ok)
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed, "still claimed until the new lease ends")
		require.Equal(t, storedriver.StatusClaimed, e.status(c.MessageID))

		ok, err = e.d().RetryClaimAfter(e.ctx, c.ID, c.ClaimToken, 0)
		require.NoError(t, err)
		require.True(t, ok)
		res := e.claim(10, storedriver.OrderingRules{})
		require.Len(t, res.Claimed, 1, "claimable once the shortened lease has ended")
		require.Equal(t, c.ID, res.Claimed[0].ID)
		require.NotEqual(t, c.ClaimToken, res.Claimed[0].ClaimToken)
		ok, err = e.d().RetryClaimAfter(e.ctx, c.ID, c.ClaimToken, 0)
		require.NoError(t, err)
		require.False(t, ok, "the old claim is gone")
	})

	t.Run("MarkDispatchedAll", func(t *testing.T) {
		e := newEnv(t, h)
		e.enqueue(msg("t", `{"i": 1}`), msg("t", `{"i": 2}`), msg("t", `{"i": 3}`))
		claimed := e.claim(10, storedriver.OrderingRules{}).Claimed
		require.Len(t, claimed, 3)
		// One row finished before the batch is recorded: it stays sent.
		ok, err := e.d().MarkSent(e.ctx, claimed[0].MessageID)
		require.NoError(t, err)
		require.True(t, ok)
		forged := claimed[2]
		forged.ClaimToken = uuid.New()

		n, err := e.d().MarkDispatchedAll(e.ctx, []storedriver.Claimed{claimed[0], claimed[1], forged})
		require.NoError(t, err)
		require.Equal(t, 1, n, "only rows still claimed under their token move")
		require.Equal(t, storedriver.StatusSent, e.status(claimed[0].MessageID))
		require.Equal(t, storedriver.StatusDispatched, e.status(claimed[1].MessageID))
		require.Equal(t, storedriver.StatusClaimed, e.status(claimed[2].MessageID))

		n, err = e.d().MarkDispatchedAll(e.ctx, claimed[1:])
		require.NoError(t, err)
		require.Equal(t, 1, n, "a dispatched row does not move again")
		require.Equal(t, storedriver.StatusDispatched, e.status(claimed[2].MessageID))
		n, err = e.d().MarkDispatchedAll(e.ctx, nil)
		require.NoError(t, err)
		require.Zero(t, n)

		// Dispatched rows are not claimable, whatever their lease was.
		require.Empty(t, e.claim(10, storedriver.OrderingRules{}).Claimed)
		st, err := e.d().Stats(e.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, st.ByStatus[storedriver.StatusDispatched])
		require.EqualValues(t, 2, st.InFlight)
	})
}
