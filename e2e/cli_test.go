package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/server/temporaltest"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// syncBuffer is a bytes.Buffer safe for a command's logger and the test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCommands runs migrate, worker, relay and enqueue with the outbox binary, against
// a Temporal server whose namespace does not have the search attributes yet.
func TestCommands(t *testing.T) {
	t.Parallel()
	ts := temporaltest.NewServer(temporaltest.WithT(t))
	_, st := testdb.Schema(t)
	recv := newReceiver(t)

	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
schema: %s
temporal:
  address: %s
  namespace: %s
  task_queue: cli-%s
relay:
  poll_interval: 200ms
topics:
  order.created:
    url: %s/events
`, st.Schema(), ts.GetFrontendHostPort(), ts.GetDefaultNamespace(), st.Schema(), recv.URL)), 0o600))
	env := map[string]string{"DATABASE_URL": testdb.URL()}

	start := func(args ...string) (*syncBuffer, func()) {
		p := startOutbox(t, "", env, append(args, "--config", cfgPath)...)
		stop := func() {
			code, exited := p.interrupt(30 * time.Second)
			if !exited {
				t.Errorf("%s did not stop within 30s", args[0])
				return
			}
			require.Equal(t, 0, code, p.out.String()) // 0: ok
		}
		return p.out, stop
	}

	out, code := runOutbox(t, time.Minute, "", env, "migrate", "--config", cfgPath)
	require.Equal(t, 0, code, out) // 0: ok
	require.Contains(t, out, "is up to date", "the test schema was migrated already")

	workerOut, stopWorker := start("worker")
	relayOut, stopRelay := start("relay")

	out, code = runOutbox(t, time.Minute, `{"order_id": 42}`, env, "enqueue", "order.created", "--config", cfgPath)
	require.Equal(t, 0, code, out) // 0: ok
	id := uuid.MustParse(strings.TrimSpace(out))

	require.Eventually(t, func() bool {
		row, err := st.Get(context.Background(), id)
		require.NoError(t, err)
		return row.Status == store.StatusSent
	}, 60*time.Second, 50*time.Millisecond, "worker:\n%s\nrelay:\n%s", workerOut, relayOut)
	requests, _ := recv.Count(id.String())
	require.Equal(t, 1, requests)

	stopRelay()
	stopWorker()
	require.Contains(t, workerOut.String(), "Worker stopped")
	require.Contains(t, relayOut.String(), "Relay stopped")
}

// TestBenchSmoke runs a short `outbox bench` (a few hundred messages), so the benchmark
// cannot rot; its figures are not checked, only that every shape drained and reported.
func TestBenchSmoke(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	cmd := exec.Command(bin, "bench", "--messages", "200", "--latency-messages", "40", "--rate", "20")
	cmd.Env = append(devEnv(), "DATABASE_URL="+testdb.URL())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{"| naive |", "| bare |", "| outbox |", "| run |", "| dev |", "msg/s |", "actions/msg | events/msg |",
		"| outbox run (run) |", "| outbox worker (outbox) |", "| outbox relay (outbox) |", "| outbox run (one process, eager start) | 20.0 msg/s |"} {
		require.Contains(t, string(out), want)
	}
	// The naive shape's cost follows from its shape: the start and three activities, one
	// attempt each; 5 events per activity, 3 per workflow task (4 tasks), start and close.
	require.Regexp(t, `\| naive \|[^\n]*\| 4\.0 \| 23\.0 \|`, string(out), "the naive shape costs 4 actions and 23 events per message")
	// The outbox's (and bare's, the same workflow with no-op activities): the start and
	// the first workflow task's local activities (the send, which records the row).
	for _, shape := range []string{"bare", "outbox", "run", "dev"} {
		require.Regexp(t, `\| `+shape+` \|[^\n]*\| 2\.0 \| 6\.0 \|`, string(out), "the %s shape costs 2 actions and 6 events per message", shape)
	}
	t.Logf("outbox bench:\n%s", out)

	// The batch lane beside the message lane: 300 messages are 3 batches of 100, each the
	// start and one task of its local send (2 actions, 6 events).
	cmd = exec.Command(bin, "bench", "--lane", "batch", "--messages", "300", "--latency-messages", "60", "--rate", "50")
	cmd.Env = append(devEnv(), "DATABASE_URL="+testdb.URL())
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `\| message \|[^\n]*\| 2\.000 \| 6\.00 \|`, string(out))
	require.Regexp(t, `\| batch \|[^\n]*\| 0\.020 \| 0\.06 \|`, string(out), "a batch of 100 costs 2 actions and 6 events")
	require.Contains(t, string(out), "| batch | 50.0 msg/s | 60 |")
	t.Logf("outbox bench --lane batch:\n%s", out)

	// One topic beside a hanging one and beside a backlog of another.
	cmd = exec.Command(bin, "bench", "--isolation", "--latency-messages", "20", "--rate", "20", "--bulk", "200")
	cmd.Env = append(devEnv(), "DATABASE_URL="+testdb.URL())
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{"| nothing (idle) | 20 |", "| a topic whose downstream hangs to the send timeout (30 s), 20 msg/s | 20 |",
		"| a topic draining 200 rows committed at once | 20 |"} {
		require.Contains(t, string(out), want)
	}
	t.Logf("outbox bench --isolation:\n%s", out)
}
