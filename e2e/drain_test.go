package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestWorkerDrainsOnSIGTERM: SIGTERM to outbox worker (a rolling deploy) while a send is
// in flight lets that send finish, under the default worker.stop_timeout, instead of
// cancelling it into an ambiguous failure that is resent: the receiver gets the message
// once, the row is sent with retry_times 0, and the process exits 0. outbox run (relay and
// worker in one process, the relay starting eagerly) does the same: its relay hands the
// message over, and on SIGTERM it stops first and the worker drains.
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	for _, command := range []string{"worker", "run"} {
		t.Run(command, func(t *testing.T) {
			t.Parallel()
			testDrainOnSIGTERM(t, bin, command)
		})
	}
}

func testDrainOnSIGTERM(t *testing.T, bin, command string) {
	ts := newServer(t)
	e := newEnv(t, ts)
	var requests atomic.Int32
	arrived := make(chan struct{}, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case arrived <- struct{}{}:
		default:
		}
		time.Sleep(3 * time.Second) // a receiver that takes its time, well within the 30s send timeout
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(slow.Close)

	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
schema: %s
temporal:
  address: %s
  namespace: %s
  task_queue: %s
topics:
  order.created:
    url: %s/events
`, e.store.Schema(), ts.GetFrontendHostPort(), e.namespace, e.taskQueue, slow.URL)), 0o600))
	var out bytes.Buffer
	cmd := exec.Command(bin, command, "--config", cfgPath)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testdb.URL())
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	if command == "worker" {
		e.startRelay(t)
	}

	id := e.enqueueOrderPlain(t, "order.created", nil)
	select {
	case <-arrived:
	case <-time.After(60 * time.Second):
		t.Fatalf("the send did not reach the receiver:\n%s", out.String())
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "outbox %s exits 0 after draining:\n%s", command, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("outbox %s did not exit within 60s of SIGTERM:\n%s", command, out.String())
	}

	ctx := context.Background()
	row, err := e.store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.StatusSent, row.Status, "the send in flight finished and was recorded:\n%s", out.String())
	require.Zero(t, row.RetryTimes, "no attempt failed")
	require.EqualValues(t, 1, requests.Load(), "delivered once")

	// The process published its file's delivery policies under the name of what it runs:
	// outbox run's worker and relay share one publication, made for both.
	published, err := e.store.PublishedPolicy(ctx)
	require.NoError(t, err)
	role := map[string]string{"worker": "worker ", "run": "relay and worker "}[command]
	require.True(t, strings.HasPrefix(published.By, role), "published by %q, want %q first", published.By, role)
	require.Contains(t, published.By, cfgPath)
}
