package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// teamWorker runs a team's worker on queue with what register adds, until the test ends.
func teamWorker(t *testing.T, e *env, queue string, register func(sdkworker.Worker)) {
	t.Helper()
	w := sdkworker.New(e.client, queue, sdkworker.Options{})
	register(w)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
}

// inventoryTeam is a team's own worker on its own task queue: it serves ReserveStock and
// HasReservation, keeps one reservation per message ID, and answers as told.
type inventoryTeam struct {
	mu       sync.Mutex
	attempts map[string][]int           // message ID → the attempts ReserveStock got
	keys     map[string][]string        // message ID → the ordering key each attempt got
	reserved map[string]json.RawMessage // message ID → payload, once reserved
	answers  map[string][]error         // message ID → errors for its next attempts
}

func (it *inventoryTeam) ReserveStock(ctx context.Context, m delivery.Message) error {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.attempts[m.MessageID] = append(it.attempts[m.MessageID], m.Attempt)
	if it.keys != nil {
		it.keys[m.MessageID] = append(it.keys[m.MessageID], m.OrderingKey)
	}
	if next := it.answers[m.MessageID]; len(next) > 0 {
		it.answers[m.MessageID] = next[1:]
		if next[0] != nil {
			return next[0]
		}
	}
	if _, ok := it.reserved[m.MessageID]; !ok {
		it.reserved[m.MessageID] = m.Payload
	}
	return nil
}

func (it *inventoryTeam) HasReservation(ctx context.Context, m delivery.Message) (bool, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	_, ok := it.reserved[m.MessageID]
	return ok, nil
}

// TestActivityTopic runs two workers, the outbox's and a team's on its own task queue, as
// a mixed fleet does: a topic configured with activity: is delivered by the team's
// activity (the outbox's worker has no handler for it), retried after a retryable error
// as that error asks, and dead-lettered with the reason of a non-retryable one. Each
// attempt gets the message's ordering key: the first from the relay's input, a retry from
// the row.
func TestActivityTopic(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	teamQueue := "inventory-" + e.store.Schema()
	e.cfg.Topics["inventory.reserve"] = config.Topic{
		Activity: "ReserveStock", TaskQueue: teamQueue, CheckActivity: "HasReservation",
		StartToClose: config.Duration(10 * time.Second), ScheduleToStart: config.Duration(time.Minute),
		InitialInterval: config.Duration(50 * time.Millisecond), MaxInterval: config.Duration(time.Second),
	}
	team := &inventoryTeam{attempts: map[string][]int{}, keys: map[string][]string{}, reserved: map[string]json.RawMessage{}, answers: map[string][]error{}}
	teamWorker(t, e, teamQueue, func(w sdkworker.Worker) {
		w.RegisterActivityWithOptions(team.ReserveStock, activity.RegisterOptions{Name: "ReserveStock"})
		w.RegisterActivityWithOptions(team.HasReservation, activity.RegisterOptions{Name: "HasReservation"})
	})
	e.startWorker(t)
	e.startRelay(t)

	keys := 0
	enqueue := func(answers ...error) string {
		keys++
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "inventory.reserve", Payload: json.RawMessage(`{"sku": "SKU-1", "qty": 2}`),
			OrderingKey: fmt.Sprintf("order-%d", keys)})
		require.NoError(t, err)
		team.mu.Lock()
		team.answers[id.String()] = answers
		team.mu.Unlock()
		return id.String()
	}
	busy := temporal.NewApplicationErrorWithOptions("stock service busy", "Busy", temporal.ApplicationErrorOptions{NextRetryDelay: 200 * time.Millisecond})
	delivered := enqueue()
	retried := enqueue(busy)
	refused := enqueue(temporal.NewNonRetryableApplicationError("SKU-1 is discontinued", "Discontinued", nil))

	for _, id := range []string{delivered, retried} {
		e.waitStatus(t, uuidOf(t, id), store.StatusSent)
	}
	e.waitStatus(t, uuidOf(t, refused), store.StatusDead)

	team.mu.Lock()
	require.Equal(t, []int{1}, team.attempts[delivered])
	require.Equal(t, []int{1, 2}, team.attempts[retried], "the retryable error took one attempt")
	require.Equal(t, []string{"order-1"}, team.keys[delivered])
	require.Equal(t, []string{"order-2", "order-2"}, team.keys[retried])
	require.Equal(t, []int{1}, team.attempts[refused], "the non-retryable error took the only attempt")
	require.JSONEq(t, `{"sku": "SKU-1", "qty": 2}`, string(team.reserved[delivered]))
	require.NotContains(t, team.reserved, refused)
	team.mu.Unlock()

	// The failed attempt is on the row, as a sink's would be.
	row, err := e.store.Get(ctx, uuidOf(t, retried))
	require.NoError(t, err)
	require.Equal(t, 1, row.RetryTimes)
	require.NotNil(t, row.LastError)
	require.Equal(t, "stock service busy", *row.LastError)

	dls, err := e.store.DeadLetters(ctx, uuidOf(t, refused))
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "permanent failure: SKU-1 is discontinued", dls[0].LastError)

	// Each attempt is its own activity execution on the team's task queue, in the
	// delivery's history.
	desc := describeClosed(t, e.client, workflows.WorkflowID(retried))
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	iter := e.client.GetWorkflowHistory(ctx, workflows.WorkflowID(retried), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var scheduled []string
	for iter.HasNext() {
		ev, err := iter.Next()
		require.NoError(t, err)
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			scheduled = append(scheduled, a.GetActivityType().GetName()+"@"+a.GetTaskQueue().GetName())
		}
	}
	require.Equal(t, []string{"ReserveStock@" + teamQueue, "ReserveStock@" + teamQueue}, scheduled)
}

// TestActivityTopicWithoutWorker: a topic whose task queue no worker polls is retried
// through its attempts (nothing ran, so nothing is checked), then dead-lettered with a
// reason that names the task queue.
func TestActivityTopicWithoutWorker(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	e.cfg.Topics["billing.charge"] = config.Topic{
		Activity: "Charge", TaskQueue: "billing-nobody-polls", ScheduleToStart: config.Duration(time.Second),
		MaxAttempts: 2, InitialInterval: config.Duration(50 * time.Millisecond),
	}
	e.startWorker(t)
	e.startRelay(t)
	id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "billing.charge", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	e.waitStatus(t, id, store.StatusDead)
	dls, err := e.store.DeadLetters(ctx, id)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "gave up after 2 attempts: no worker of task queue billing-nobody-polls started activity Charge within 1s", dls[0].LastError)
}

func uuidOf(t *testing.T, s string) uuid.UUID {
	t.Helper()
	id, err := uuid.Parse(s)
	require.NoError(t, err)
	return id
}

// TestHangingTeamActivityLeavesOtherTopicsAlone: a team's activity that hangs takes the
// slots of the team's worker, not the outbox's: with two activity slots on the outbox's
// worker and more hanging deliveries than that, another topic's messages are all
// delivered while the hanging ones are still in flight.
func TestHangingTeamActivityLeavesOtherTopicsAlone(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	teamQueue := "slow-" + e.store.Schema()
	e.cfg.Topics["report.render"] = config.Topic{Activity: "RenderReport", TaskQueue: teamQueue, StartToClose: config.Duration(time.Minute)}
	release := make(chan struct{})
	var hanging sync.WaitGroup
	teamWorker(t, e, teamQueue, func(w sdkworker.Worker) {
		w.RegisterActivityWithOptions(func(ctx context.Context, _ delivery.Message) error {
			hanging.Done()
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}, activity.RegisterOptions{Name: "RenderReport"})
	})
	t.Cleanup(func() { close(release) })

	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	e.run(t, func(ctx context.Context) error {
		return worker.Run(ctx, worker.Config{Client: e.client, TaskQueue: e.taskQueue, Options: sdkworker.Options{MaxConcurrentActivityExecutionSize: 2},
			Deps: worker.Deps{Store: e.store, Handlers: reg, Logger: logger}})
	})
	e.startRelay(t)

	hanging.Add(4)
	var reports []uuid.UUID
	for range 4 {
		id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "report.render", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		reports = append(reports, id)
	}
	hanging.Wait() // four attempts hang on the team's worker
	var orders []uuid.UUID
	for range 10 {
		orders = append(orders, e.enqueueOrderPlain(t, "order.created", nil))
	}
	for _, id := range orders {
		e.waitStatus(t, id, store.StatusSent)
	}
	for _, id := range reports {
		require.Equal(t, store.StatusDispatched, e.status(t, id), "still in flight")
	}
}

// TestActivityTopicPayloadTemporalCannotCarry runs a team topic with the store's limit at
// its largest: a payload within that limit whose JSON encoding Temporal refuses (each <,
// > and & takes six bytes in it) is dead-lettered with the reason, not started or loaded
// again and again, and one whose encoding fits reaches the team's activity whole.
func TestActivityTopicPayloadTemporalCannotCarry(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	st, err := store.New(e.pool, store.Config{Schema: e.store.Schema(), MaxPayloadBytes: store.HardMaxPayloadBytes})
	require.NoError(t, err)
	teamQueue := "inventory-" + e.store.Schema()
	e.cfg.Topics["inventory.reserve"] = config.Topic{Activity: "ReserveStock", TaskQueue: teamQueue,
		StartToClose: config.Duration(30 * time.Second), ScheduleToStart: config.Duration(time.Minute)}
	team := &inventoryTeam{attempts: map[string][]int{}, reserved: map[string]json.RawMessage{}, answers: map[string][]error{}}
	teamWorker(t, e, teamQueue, func(w sdkworker.Worker) {
		w.RegisterActivityWithOptions(team.ReserveStock, activity.RegisterOptions{Name: "ReserveStock"})
	})
	e.startWorkerWith(t, st)
	e.startRelayWith(t, st, starter.Config{})

	// Markup characters whose encoding fits, and a payload of a fifth as many again: well
	// within the store's limit, its encoding is past Temporal's 2 MiB, so that without the
	// check its run would never start (or its load never return), and nothing would
	// dead-letter it.
	fits := (store.HardMaxPayloadBytes - 2) / 6
	enqueue := func(n int) uuid.UUID {
		id, err := st.Enqueue(ctx, e.pool, store.Message{Topic: "inventory.reserve", Payload: json.RawMessage(`"` + strings.Repeat("<", n) + `"`)})
		require.NoError(t, err, "within the store's limit")
		return id
	}
	carried, refused := enqueue(fits), enqueue(fits*6/5)

	e.waitStatus(t, refused, store.StatusDead)
	dls, err := st.DeadLetters(ctx, refused)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Contains(t, dls[0].LastError, "as Temporal's JSON encoding carries it to a team's handler")
	require.Equal(t, 1, dls[0].Attempts, "a permanent failure: no retries")

	e.waitStatus(t, carried, store.StatusSent)
	team.mu.Lock()
	defer team.mu.Unlock()
	require.NotContains(t, team.attempts, refused.String(), "the team never got it")
	require.Equal(t, []int{1}, team.attempts[carried.String()])
	var got string // the team's RawMessage holds it as Temporal carried it, escaped
	require.NoError(t, json.Unmarshal(team.reserved[carried.String()], &got))
	require.True(t, got == strings.Repeat("<", fits), "the team got the payload whole (%d characters of %d)", len(got), fits)
}
