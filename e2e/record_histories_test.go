package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/temporalproto"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// recordEnv names the environment variable that makes TestRecordHistories write the
// replay test's histories.
const recordEnv = "OUTBOX_RECORD_HISTORIES"

// recordGeneration names the folder of workflows/testdata that TestRecordHistories
// writes. The replay test replays every generation, so when a change to OutboxDelivery adds
// a path or changes its input, bump this and record: the older generations stay, guarded.
const recordGeneration = "v2"

// historiesDir is where workflows/replay_test.go reads the recorded histories from.
var historiesDir = filepath.Join("..", "workflows", "testdata", recordGeneration)

// TestRecordHistories runs OutboxDelivery through its main paths against the in-process
// Temporal server and writes each run's history as JSON (the format the Temporal CLI
// exports and worker.WorkflowReplayer reads) to workflows/testdata/<recordGeneration>,
// where the replay test checks that the current workflow code still replays them.
func TestRecordHistories(t *testing.T) {
	if os.Getenv(recordEnv) != "1" {
		t.Skipf("set %s=1 to record the workflow histories: %s=1 go test -count=1 -run TestRecordHistories ./e2e/", recordEnv, recordEnv)
	}
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()

	// fast returns a topic on the env's receiver with short waits between attempts.
	fast := func(e *env) config.Topic {
		return config.Topic{Sink: "http", URL: e.recv.srv.URL + "/events",
			InitialInterval: config.Duration(50 * time.Millisecond), MaxInterval: config.Duration(200 * time.Millisecond),
			Timeout: config.Duration(5 * time.Second)}
	}

	for _, sc := range []struct {
		file string
		// run sets the env up, enqueues one message and waits for its row's final status.
		run func(t *testing.T, e *env) uuid.UUID
		// failed says whether the run ends failed (dead-lettered).
		failed bool
	}{
		{
			file: "delivery_success.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.created", nil)
				e.waitStatus(t, id, store.StatusSent)
				return id
			},
		},
		{
			file: "delivery_retries_then_success.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				e.cfg.Topics["order.flaky"] = fast(e)
				e.recv.setStatus("order.flaky", http.StatusServiceUnavailable) // retryable, not ambiguous
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.flaky", nil)
				require.Eventually(t, func() bool {
					row, err := e.store.Get(ctx, id)
					require.NoError(t, err)
					return row.RetryTimes >= 2
				}, 60*time.Second, 10*time.Millisecond)
				e.recv.clearStatus("order.flaky")
				e.waitStatus(t, id, store.StatusSent)
				requests, _ := e.recv.count(id)
				require.GreaterOrEqual(t, requests, 3)
				return id
			},
		},
		{
			file: "delivery_dead_letter.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				// 500 is ambiguous; without a check_url check-processed is unsupported, so
				// the history holds a send, a timer, a check, a second send and the dead letter.
				e.recv.setStatus("order.failing", http.StatusInternalServerError)
				e.start(t)
				one := 1
				id := e.enqueueOrderPlain(t, "order.failing", &one)
				e.waitStatus(t, id, store.StatusDead)
				return id
			},
			failed: true,
		},
		{
			file: "delivery_check_processed_skip.json",
			run: func(t *testing.T, e *env) uuid.UUID {
				check := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(http.StatusOK) // the downstream has the message
				}))
				t.Cleanup(check.Close)
				topic := fast(e)
				topic.CheckURL = check.URL + "/events/{message_id}"
				e.cfg.Topics["order.checked"] = topic
				e.recv.setStatus("order.checked", http.StatusInternalServerError) // ambiguous
				e.start(t)
				id := e.enqueueOrderPlain(t, "order.checked", nil)
				e.waitStatus(t, id, store.StatusSent)
				requests, _ := e.recv.count(id)
				require.Equal(t, 1, requests, "check-processed said processed: no second send")
				return id
			},
		},
	} {
		t.Run(sc.file, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, ts)
			id := sc.run(t, e)
			wid := workflows.WorkflowID(id.String())

			waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			var res workflows.DeliveryResult
			err := e.client.GetWorkflow(waitCtx, wid, "").Get(waitCtx, &res)
			if sc.failed {
				require.ErrorContains(t, err, workflows.ErrTypeDeadLettered)
			} else {
				require.NoError(t, err)
			}

			hist := &historypb.History{}
			iter := e.client.GetWorkflowHistory(ctx, wid, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
			for iter.HasNext() {
				ev, err := iter.Next()
				require.NoError(t, err)
				hist.Events = append(hist.Events, ev)
			}
			require.NotEmpty(t, hist.Events)
			data, err := temporalproto.CustomJSONMarshalOptions{Indent: "  "}.Marshal(hist)
			require.NoError(t, err)
			require.NoError(t, os.MkdirAll(historiesDir, 0o755))
			path := filepath.Join(historiesDir, sc.file)
			require.NoError(t, os.WriteFile(path, append(data, '\n'), 0o644))
			t.Logf("wrote %s (%d events)", path, len(hist.Events))
		})
	}
}

// start runs the env's worker and relay.
func (e *env) start(t *testing.T) {
	t.Helper()
	e.startWorker(t)
	e.startRelay(t)
}

// clearStatus makes the receiver accept the topic's messages again.
func (r *receiver) clearStatus(topic string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.status, topic)
}
