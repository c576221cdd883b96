package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/temporalcost"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// enqueueMany commits n messages of topic, 100 per transaction, and returns their IDs in
// commit order.
func enqueueMany(t *testing.T, e *env, topic string, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var ids []uuid.UUID
	for len(ids) < n {
		msgs := make([]store.Message, 0, 100)
		for i := len(ids); i < n && len(msgs) < 100; i++ {
			msgs = append(msgs, store.Message{Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"click": %d}`, i))})
		}
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		res, err := e.store.EnqueueBatch(ctx, tx, msgs)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		for _, r := range res {
			ids = append(ids, r.MessageID)
		}
	}
	return ids
}

// flaky makes the receiver answer each message of fails with 503 for its first fails[id]
// requests, then process it.
func flaky(recv interface{ Count(string) (int, int) }, fails map[string]int) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, req *http.Request) bool {
		key := req.Header.Get("Idempotency-Key")
		n, ok := fails[key]
		if !ok {
			return false
		}
		if requests, _ := recv.Count(key); requests <= n {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return true
		}
		return false
	}
}

// waitDrained waits until the topic's rows are all sent or dead, sent of them sent.
func waitDrained(t *testing.T, st *store.Store, topic string, sent, dead int64, within time.Duration, logs func() string) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, err := st.Stats(context.Background())
		require.NoError(t, err)
		by := s.ByTopic[topic]
		return by[store.StatusSent] == sent && by[store.StatusDead] == dead
	}, within, 100*time.Millisecond, "%s", logs())
}

// TestBatchLane delivers 1,000 messages of a topic of lane batch through a real Temporal
// server with the default retry policy, with a downstream that fails 10 of them 2 or 3
// times and rejects 2: the 998 reach the downstream exactly once, the batches record them
// sent and every row names its batch; each of the 10 has a run of its own that goes on
// from the batch's attempt and shows its retries; the 2 are dead-lettered with the
// downstream's answer. The batches cost at most 0.1 Temporal actions per message they
// delivered.
func TestBatchLane(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.cfg.Topics["clicks"] = config.Topic{Sink: "http", URL: e.recv.URL + "/events", Lane: config.LaneBatch}
	e.startWorker(t)

	ids := enqueueMany(t, e, "clicks", 1000)
	fails := map[string]int{}
	for i := range 10 {
		fails[ids[50+i*97].String()] = 2 + i%2
	}
	rejected := []uuid.UUID{ids[7], ids[993]}
	for _, id := range rejected {
		e.recv.Reject(id.String(), http.StatusBadRequest)
	}
	e.recv.Before = flaky(e.recv, fails)
	began := time.Now()
	e.startRelay(t)
	waitDrained(t, e.store, "clicks", 998, 2, 3*time.Minute, func() string { return "the batch lane did not drain" })
	t.Logf("1,000 messages drained in %s", time.Since(began).Round(time.Millisecond))

	snap := e.recv.Snapshot()
	require.Empty(t, snap.Bad, "every request kept the downstream contract")
	require.Empty(t, snap.Redelivered, "no message reached the downstream after it had it")
	ctx := context.Background()
	rows, err := e.store.GetAll(ctx, ids)
	require.NoError(t, err)
	batches := map[string]int{}
	for _, id := range ids {
		row := rows[id]
		require.NotNil(t, row.BatchID, "message %s names its batch", id)
		batches[*row.BatchID]++
		switch n, isFlaky := fails[id.String()]; {
		case id == rejected[0] || id == rejected[1]:
			require.Equal(t, store.StatusDead, row.Status)
			require.Contains(t, *row.LastError, "HTTP 400", "the dead letter's reason is the downstream's answer")
			requests, effects := e.recv.Count(id.String())
			require.Equal(t, 1, requests, "a permanent failure is not sent again")
			require.Zero(t, effects)
		case isFlaky:
			require.Equal(t, store.StatusSent, row.Status)
			requests, effects := e.recv.Count(id.String())
			require.Equal(t, n+1, requests, "message %s: the batch's attempt, %d retries", id, n)
			require.Equal(t, 1, effects)
			require.Equal(t, n, row.RetryTimes)
		default:
			require.Equal(t, store.StatusSent, row.Status)
			requests, effects := e.recv.Count(id.String())
			require.Equal(t, 1, requests, "message %s was sent once", id)
			require.Equal(t, 1, effects)
		}
	}
	require.GreaterOrEqual(t, len(batches), 10, "at most 100 messages a batch")

	// Each message in trouble has a run of its own, which goes on from the batch's attempt.
	for id, n := range fails {
		wid := workflows.WorkflowID(id)
		desc := describeClosed(t, e.client, wid)
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
		in, attempts := runStory(t, e.client, wid)
		require.NotNil(t, in.Prior, "message %s was handed over by its batch", id)
		require.Equal(t, 1, in.Prior.Attempts)
		require.Contains(t, in.Prior.Error, "HTTP 503")
		require.Equal(t, *rows[uuid.MustParse(id)].BatchID, in.Prior.Batch)
		want := make([]int, n)
		for i := range want {
			want[i] = i + 2
		}
		require.Equal(t, want, attempts, "message %s: attempts 2 to %d in its own run", id, n+1)
	}
	for _, id := range rejected {
		desc := describeClosed(t, e.client, workflows.WorkflowID(id.String()))
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, desc.GetWorkflowExecutionInfo().GetStatus())
		letters, err := e.store.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, letters, 1)
		require.Contains(t, letters[0].LastError, "permanent failure")
	}

	// What the batches cost, from their histories.
	var cost temporalcost.Cost
	var delivered int
	for batch := range batches {
		desc := describeClosed(t, e.client, batch)
		require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus(), batch)
		c, err := temporalcost.OfRun(ctx, e.client, batch, "")
		require.NoError(t, err)
		cost = cost.Add(c)
		var res workflows.BatchResult
		require.NoError(t, e.client.GetWorkflow(ctx, batch, "").Get(ctx, &res))
		delivered += res.Sent
	}
	require.Equal(t, 998-len(fails), delivered, "every message but those in trouble was delivered by its batch")
	perMessage := float64(cost.Actions) / float64(delivered)
	t.Logf("%d batches: %d actions and %d events, %.3f actions per message they delivered", len(batches), cost.Actions, cost.Events, perMessage)
	require.LessOrEqual(t, perMessage, 0.1)

	// outbox show names each message's batch and what it came to there, and the run of
	// its own of a message that left the batch.
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf("schema: %s\ntemporal:\n  address: %s\n  namespace: %s\n  task_queue: %s\n",
		e.store.Schema(), ts.GetFrontendHostPort(), e.namespace, e.taskQueue)), 0o600))
	show := func(id uuid.UUID) (text string, v struct {
		Batch struct {
			WorkflowID string `json:"workflow_id"`
			Status     string `json:"status"`
			Outcome    string `json:"outcome"`
			Error      string `json:"error"`
		} `json:"batch"`
		Runs []struct {
			Attempts []struct {
				Activity string `json:"activity"`
				Outcome  string `json:"outcome"`
			} `json:"attempts"`
		} `json:"runs"`
	}) {
		procEnv := map[string]string{"DATABASE_URL": testdb.URL()}
		out, code := runOutbox(t, time.Minute, "", procEnv, "show", id.String(), "--json", "--config", cfgPath)
		require.Equal(t, 0, code, out) // 0: ok
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		text, code = runOutbox(t, time.Minute, "", procEnv, "show", id.String(), "--config", cfgPath)
		require.Equal(t, 0, code, text)
		return text, v
	}
	text, plain := show(ids[0])
	require.Equal(t, *rows[ids[0]].BatchID, plain.Batch.WorkflowID)
	require.Equal(t, "Completed", plain.Batch.Status)
	require.Equal(t, "sent", plain.Batch.Outcome)
	require.Empty(t, plain.Runs, "delivered by its batch: no run of its own")
	require.Contains(t, text, "Batch        "+plain.Batch.WorkflowID+"  Completed, the message sent")
	troubled := ids[50]
	text, v := show(troubled)
	require.Equal(t, "handed_over", v.Batch.Outcome)
	require.Contains(t, v.Batch.Error, "HTTP 503")
	require.Len(t, v.Runs, 1)
	var sends []string
	for _, a := range v.Runs[0].Attempts {
		if a.Activity == workflows.ActivitySend {
			sends = append(sends, a.Outcome)
		}
	}
	require.Equal(t, []string{"failed", "ok"}, sends, "its own run's attempts 2 (failed) and 3")
	require.Contains(t, text, "the message handed over after: POST")
}

// runStory returns a delivery run's input and the attempts its send activities made, in
// order, from its history.
func runStory(t *testing.T, c client.Client, workflowID string) (workflows.DeliveryInput, []int) {
	t.Helper()
	ctx := context.Background()
	var in workflows.DeliveryInput
	var attempts []int
	it := c.GetWorkflowHistory(ctx, workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		require.NoError(t, err)
		switch {
		case ev.GetWorkflowExecutionStartedEventAttributes() != nil:
			p := ev.GetWorkflowExecutionStartedEventAttributes().GetInput().GetPayloads()[0]
			require.NoError(t, json.Unmarshal(p.GetData(), &in))
		case ev.GetActivityTaskScheduledEventAttributes() != nil:
			a := ev.GetActivityTaskScheduledEventAttributes()
			if a.GetActivityType().GetName() != workflows.ActivitySend {
				continue
			}
			var send workflows.SendInput
			require.NoError(t, json.Unmarshal(a.GetInput().GetPayloads()[0].GetData(), &send))
			attempts = append(attempts, send.Attempt)
		}
	}
	return in, attempts
}

// TestBatchLaneKilled runs the batch lane as teams run it, outbox worker and outbox relay
// as separate processes with the default settings, and kills both (SIGKILL) twice while
// 1,000 messages drain: every message reaches the downstream and its row ends sent.
func TestBatchLaneKilled(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	pool, st := testdb.Schema(t)
	recv := newReceiver(t)
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
schema: %s
temporal:
  address: %s
  namespace: %s
  task_queue: batch-%s
topics:
  clicks:
    url: %s/events
    lane: batch
`, st.Schema(), ts.GetFrontendHostPort(), ts.GetDefaultNamespace(), st.Schema(), recv.URL)), 0o600))
	procEnv := map[string]string{"DATABASE_URL": testdb.URL()}
	e := &env{pool: pool, store: st}
	ids := enqueueMany(t, e, "clicks", 1000)

	var logs strings.Builder
	start := func() (*outboxProcess, *outboxProcess) {
		return startOutbox(t, "", procEnv, "worker", "--config", cfgPath), startOutbox(t, "", procEnv, "relay", "--config", cfgPath)
	}
	worker, relay := start()
	for round, at := range []int{150, 500} {
		require.Eventually(t, func() bool {
			_, effects := recv.Totals()
			return effects >= at
		}, 2*time.Minute, 5*time.Millisecond, "round %d: worker:\n%s\nrelay:\n%s", round, worker.out, relay.out)
		require.NoError(t, worker.cmd.Process.Kill())
		require.NoError(t, relay.cmd.Process.Kill())
		worker.wait()
		relay.wait()
		fmt.Fprintf(&logs, "round %d worker:\n%s\nrelay:\n%s\n", round, worker.out, relay.out)
		worker, relay = start()
	}
	waitDrained(t, st, "clicks", 1000, 0, 5*time.Minute, func() string {
		return logs.String() + "last worker:\n" + worker.out.String() + "\nlast relay:\n" + relay.out.String()
	})
	var resent int
	for _, id := range ids {
		requests, effects := recv.Count(id.String())
		require.Equal(t, 1, effects, "message %s reached the downstream", id)
		resent += requests - 1
	}
	// A batch lost with its worker hands its messages to runs of their own; those it had
	// delivered and not yet recorded are sent again (at least once: no check_url here).
	t.Logf("1,000 messages, worker and relay killed twice: none lost, %d sent again", resent)
	require.Empty(t, recv.Snapshot().Bad, "every request kept the downstream contract")
	for _, p := range []*outboxProcess{worker, relay} {
		code, exited := p.interrupt(30 * time.Second)
		require.True(t, exited)
		require.Equal(t, 0, code, p.out.String()) // 0: ok
	}
}

// TestBatchLaneBrokers delivers topics of lane batch to the real brokers through a real
// Temporal server: NATS JetStream with its batch publish, RabbitMQ with a confirm for each
// publish. Every message is stored once, by its batch.
func TestBatchLaneBrokers(t *testing.T) {
	t.Parallel()
	useRabbitMQ(t)
	st, prefix := natsStream(t, "outbox_batch_")
	exchange, queue := rabbitTopology(t, "clicks")

	e := newEnv(t, newServer(t))
	e.cfg.Topics["clicks.nats"] = config.Topic{Sink: "nats", URL: natsURL(), Subject: prefix + ".{topic}", Lane: config.LaneBatch}
	e.cfg.Topics["clicks.rabbit"] = config.Topic{Sink: "rabbitmq", URL: rabbitURL(), Exchange: exchange, RoutingKey: "clicks", Lane: config.LaneBatch}
	e.startWorker(t)
	viaNATS := enqueueMany(t, e, "clicks.nats", 300)
	viaRabbit := enqueueMany(t, e, "clicks.rabbit", 300)
	e.startRelay(t)
	e.waitAllSent(t, append(slices.Clone(viaNATS), viaRabbit...), 2*time.Minute)

	info, err := st.Info(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, len(viaNATS), info.State.Msgs, "the stream stored each message once")
	requireOnceEach(t, viaRabbit, drainQueue(t, queue))
	rows, err := e.store.GetAll(context.Background(), append(slices.Clone(viaNATS), viaRabbit...))
	require.NoError(t, err)
	for id, row := range rows {
		require.NotNil(t, row.BatchID, "message %s was delivered by a batch", id)
	}
}
