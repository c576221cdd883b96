package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamactivity"
	"github.com/outbox-go/outbox/store"
)

// contractTeam is a team's delivery.Handler and delivery.Checker, registered in the team's
// own worker with teamactivity.Activity and CheckActivity. It answers each message's
// attempts as told; an answer with applied set takes the message before it fails (a
// downstream that committed, then lost the answer).
type contractTeam struct {
	mu      sync.Mutex
	answers map[string][]contractAnswer
	got     map[string][]delivery.Message // every attempt's message, by message ID
	applied map[string]bool
	checked map[string]int
	at      map[string][]time.Time // when each attempt came
}

type contractAnswer struct {
	err     error
	applied bool
}

func (c *contractTeam) Send(_ context.Context, m delivery.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got[m.MessageID] = append(c.got[m.MessageID], m)
	c.at[m.MessageID] = append(c.at[m.MessageID], time.Now())
	if next := c.answers[m.MessageID]; len(next) > 0 {
		c.answers[m.MessageID] = next[1:]
		if next[0].applied {
			c.applied[m.MessageID] = true
		}
		if next[0].err != nil {
			return next[0].err
		}
	}
	c.applied[m.MessageID] = true
	return nil
}

func (c *contractTeam) CheckProcessed(_ context.Context, m delivery.Message) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checked[m.MessageID]++
	return c.applied[m.MessageID], nil
}

// TestTeamActivityHandlerContract: a team's activity written as a delivery.Handler means
// what it means compiled into the outbox's worker, through the real Temporal server and
// the default backoff: accepted is sent after one attempt; Retryable waits at least the
// wait it names and sends again without a check; Permanent dead-letters at once with the
// reason; Ambiguous and an unmarked error ask the Checker first, which stops a resend of a
// message the team already has. Every attempt carries the message ID, its idempotency key.
func TestTeamActivityHandlerContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t))
	ctx := context.Background()
	queue := "contract-" + e.store.Schema()
	e.cfg.Topics["stock.reserve"] = config.Topic{Activity: "ReserveStock", TaskQueue: queue, CheckActivity: "HasReservation"}
	team := &contractTeam{answers: map[string][]contractAnswer{}, got: map[string][]delivery.Message{},
		applied: map[string]bool{}, checked: map[string]int{}, at: map[string][]time.Time{}}
	teamWorker(t, e, queue, func(w sdkworker.Worker) {
		w.RegisterActivityWithOptions(teamactivity.Activity(team), activity.RegisterOptions{Name: "ReserveStock"})
		w.RegisterActivityWithOptions(teamactivity.CheckActivity(team), activity.RegisterOptions{Name: "HasReservation"})
	})
	e.startWorker(t)
	e.startRelay(t)

	enqueue := func(answers ...contractAnswer) string {
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "stock.reserve", Payload: json.RawMessage(`{"sku":"SKU-1"}`)})
		require.NoError(t, err)
		team.mu.Lock()
		team.answers[id.String()] = answers
		team.mu.Unlock()
		return id.String()
	}
	const wait = 1500 * time.Millisecond // longer than the default first backoff (1s)
	accepted := enqueue()
	retryable := enqueue(contractAnswer{err: delivery.Retryable(errors.New("stock service busy"), wait)})
	permanent := enqueue(contractAnswer{err: delivery.Permanent(errors.New("SKU-1 is discontinued"))})
	ambiguousTaken := enqueue(contractAnswer{err: delivery.Ambiguous(errors.New("reply lost")), applied: true})
	ambiguousNot := enqueue(contractAnswer{err: delivery.Ambiguous(errors.New("connection reset"))})
	unmarked := enqueue(contractAnswer{err: errors.New("something odd"), applied: true})

	for _, id := range []string{accepted, retryable, ambiguousTaken, ambiguousNot, unmarked} {
		e.waitStatus(t, uuidOf(t, id), store.StatusSent)
	}
	e.waitStatus(t, uuidOf(t, permanent), store.StatusDead)

	team.mu.Lock()
	defer team.mu.Unlock()
	attempts := func(id string) []int {
		var out []int
		for _, m := range team.got[id] {
			require.Equal(t, id, m.MessageID, "the idempotency key is the message ID on every attempt")
			require.Equal(t, "stock.reserve", m.Topic)
			require.JSONEq(t, `{"sku":"SKU-1"}`, string(m.Payload))
			out = append(out, m.Attempt)
		}
		return out
	}
	require.Equal(t, []int{1}, attempts(accepted))
	require.Equal(t, []int{1, 2}, attempts(retryable))
	require.GreaterOrEqual(t, team.at[retryable][1].Sub(team.at[retryable][0]), wait, "the second attempt waited the wait Retryable named")
	require.Zero(t, team.checked[retryable], "a retryable failure needs no check")
	require.Equal(t, []int{1}, attempts(permanent))
	require.Equal(t, []int{1}, attempts(ambiguousTaken), "the check found it: no resend")
	require.Equal(t, 1, team.checked[ambiguousTaken])
	require.Equal(t, []int{1, 2}, attempts(ambiguousNot))
	require.Equal(t, 1, team.checked[ambiguousNot])
	require.Equal(t, []int{1}, attempts(unmarked), "an unmarked error is ambiguous: checked, not resent")
	require.Equal(t, 1, team.checked[unmarked])

	dls, err := e.store.DeadLetters(ctx, uuidOf(t, permanent))
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Contains(t, dls[0].LastError, "SKU-1 is discontinued")
	require.Equal(t, 1, dls[0].Attempts)
}
