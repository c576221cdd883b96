package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// shown is the part of outbox show --json this test reads.
type shown struct {
	MessageID    uuid.UUID    `json:"message_id"`
	Topic        string       `json:"topic"`
	Status       store.Status `json:"status"`
	HistoryError string       `json:"history_error"`
	Runs         []struct {
		RunID    string `json:"run_id"`
		Status   string `json:"status"`
		URL      string `json:"url"`
		Attempts []struct {
			Activity string `json:"activity"`
			Attempt  int    `json:"attempt"`
			Local    bool   `json:"local"`
			Outcome  string `json:"outcome"`
			Error    string `json:"error"`
		} `json:"attempts"`
	} `json:"runs"`
	DeadLetters []struct {
		RunID string `json:"run_id"`
	} `json:"dead_letters"`
}

// TestShow answers "what happened to message X" with outbox show, against a real server,
// for a message sent at the first attempt, one sent after a retry, a dead one and one not
// due yet; and shows the row when Temporal does not answer.
func TestShow(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	fast := e.cfg.Topics["order.created"]
	e.cfg.Topics["order.retried"] = fast
	e.cfg.Topics["order.rejected"] = fast
	e.startWorker(t)
	e.startRelay(t)
	ctx := context.Background()

	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf("schema: %s\ntemporal:\n  address: %s\n  namespace: %s\n  task_queue: %s\n",
		e.store.Schema(), ts.GetFrontendHostPort(), e.namespace, e.taskQueue)), 0o600))
	// show runs outbox show and returns what it printed and its exit code.
	show := func(env map[string]string, args ...string) (string, int) {
		all := map[string]string{"DATABASE_URL": testdb.URL()}
		maps.Copy(all, env)
		return runOutbox(t, 2*time.Minute, "", all, append([]string{"show", "--config", cfgPath}, args...)...)
	}
	showJSON := func(id uuid.UUID) shown {
		out, code := show(nil, id.String(), "--json")
		require.Equal(t, 0, code, out) // 0: ok
		var v shown
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		return v
	}
	enqueue := func(m store.Message) uuid.UUID {
		m.Payload = json.RawMessage(`{"order_id": 7}`)
		id, err := e.store.Enqueue(ctx, e.pool, m)
		require.NoError(t, err)
		return id
	}

	t.Run("SentFirstTime", func(t *testing.T) {
		id := enqueue(store.Message{Topic: "order.created"})
		e.waitStatus(t, id, store.StatusSent)
		describeClosed(t, e.client, workflows.WorkflowID(id.String()))
		v := showJSON(id)
		require.Equal(t, store.StatusSent, v.Status)
		require.Len(t, v.Runs, 1)
		require.Equal(t, "Completed", v.Runs[0].Status)
		require.Contains(t, v.Runs[0].URL, "/workflows/outbox-"+id.String()+"/"+v.Runs[0].RunID+"/history")
		require.Len(t, v.Runs[0].Attempts, 1, "%+v", v.Runs[0].Attempts)
		a := v.Runs[0].Attempts[0]
		require.Equal(t, workflows.ActivitySend, a.Activity)
		require.True(t, a.Local, "the first attempt is the first workflow task's local activity")
		require.Equal(t, "ok", a.Outcome)

		out, code := show(nil, id.String())
		require.Equal(t, 0, code, out) // 0: ok
		for _, want := range []string{"Message      " + id.String(), "Status       sent", "Sent         ", "Run 1 of 1  Completed", "OutboxSend", "local", "ok", `"order_id": 7`} {
			require.Contains(t, out, want)
		}
	})

	t.Run("SentAfterRetry", func(t *testing.T) {
		e.recv.SetStatus("order.retried", http.StatusServiceUnavailable)
		id := enqueue(store.Message{Topic: "order.retried"})
		require.Eventually(t, func() bool { n, _ := e.recv.Count(id.String()); return n >= 1 }, 30*time.Second, 20*time.Millisecond)
		e.recv.ClearStatus("order.retried")
		e.waitStatus(t, id, store.StatusSent)
		describeClosed(t, e.client, workflows.WorkflowID(id.String()))
		v := showJSON(id)
		require.Len(t, v.Runs, 1)
		var sends []string
		for _, a := range v.Runs[0].Attempts {
			if a.Activity == workflows.ActivitySend {
				sends = append(sends, fmt.Sprintf("#%d local=%t %s %s", a.Attempt, a.Local, a.Outcome, a.Error))
			}
		}
		require.Len(t, sends, 2, "%+v", v.Runs[0].Attempts)
		require.True(t, strings.HasPrefix(sends[0], "#1 local=true failed POST http://127.0.0.1:"), sends[0])
		require.True(t, strings.HasSuffix(sends[0], ": HTTP 503"), "the error as the sink wrote it: %s", sends[0])
		require.Equal(t, "#2 local=false ok ", sends[1])

		out, code := show(nil, id.String())
		require.Equal(t, 0, code, out) // 0: ok
		require.Contains(t, out, "Retries      1\n")
		t.Logf("outbox show %s:\n%s", id, out)
	})

	t.Run("Dead", func(t *testing.T) {
		e.recv.SetStatus("order.rejected", http.StatusUnprocessableEntity)
		id := enqueue(store.Message{Topic: "order.rejected"})
		e.waitStatus(t, id, store.StatusDead)
		describeClosed(t, e.client, workflows.WorkflowID(id.String()))
		v := showJSON(id)
		require.Equal(t, store.StatusDead, v.Status)
		require.Len(t, v.DeadLetters, 1)
		require.Len(t, v.Runs, 1)
		require.Equal(t, v.DeadLetters[0].RunID, v.Runs[0].RunID)
		require.NotEmpty(t, v.Runs[0].Attempts)
		require.Equal(t, "failed", v.Runs[0].Attempts[0].Outcome)
		require.Contains(t, v.Runs[0].Attempts[0].Error, "HTTP 422")

		out, code := show(nil, id.String())
		require.Equal(t, 0, code, out) // 0: ok
		require.Contains(t, out, "Dead letter 1 of 1 (open)")
	})

	t.Run("NotDueYet", func(t *testing.T) {
		id := enqueue(store.Message{Topic: "order.created", DeliverAfter: time.Now().Add(time.Hour)})
		v := showJSON(id)
		require.Equal(t, store.StatusPending, v.Status)
		require.Empty(t, v.Runs)
		require.Empty(t, v.HistoryError)
		out, code := show(nil, id.String())
		require.Equal(t, 0, code, out) // 0: ok
		require.Contains(t, out, "Next attempt ")
		require.Contains(t, out, "No workflow run yet")
	})

	t.Run("TemporalDown", func(t *testing.T) {
		id := enqueue(store.Message{Topic: "order.created", DeliverAfter: time.Now().Add(time.Hour)})
		out, code := show(map[string]string{"TEMPORAL_ADDRESS": "127.0.0.1:1"}, id.String())
		require.Equal(t, 0, code, "the row is shown without Temporal (0: ok):\n%s", out)
		require.Contains(t, out, "Message      "+id.String())
		require.Contains(t, out, "the workflow history could not be read: connect to Temporal at 127.0.0.1:1")
	})

	t.Run("Unknown", func(t *testing.T) {
		id := uuid.Must(uuid.NewV7())
		out, code := show(nil, id.String())
		require.NotEqual(t, 0, code, out)
		require.Contains(t, out, "outbox: message "+id.String()+" not found", "the error, as the command prints it")
		require.Equal(t, 1, code, out) // 1: failure
	})
}
