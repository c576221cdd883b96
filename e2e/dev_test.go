package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/workflows"
)

// devProcess is a running `outbox dev`.
type devProcess struct {
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	ready  chan struct{}
	exited chan struct{}
	err    error
}

func startDev(t *testing.T, bin string, env []string, args ...string) *devProcess {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"dev"}, args...)...)
	cmd.Env = env
	return startDevCmd(t, cmd)
}

// startDevCmd starts cmd, an `outbox dev` however it is run, and watches its output for
// the ready banner. The test's cleanup kills what is still running.
func startDevCmd(t *testing.T, cmd *exec.Cmd) *devProcess {
	t.Helper()
	p := &devProcess{cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, ready: make(chan struct{}), exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			_, _ = p.stdout.Write([]byte(line + "\n"))
			if strings.Contains(line, "is ready") {
				once.Do(func() { close(p.ready) })
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			if p.cmd.SysProcAttr != nil && p.cmd.SysProcAttr.Setpgid {
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			}
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

func (p *devProcess) waitReady(t *testing.T) {
	t.Helper()
	// The built-in Temporal server is built on the first outbox dev of a test run.
	p.waitReadyWithin(t, 5*time.Minute)
}

func (p *devProcess) waitReadyWithin(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-p.ready:
		// Give the printer goroutine the rest of the summary.
		time.Sleep(100 * time.Millisecond)
	case <-p.exited:
		t.Fatalf("outbox dev exited before it was ready: %v\nstdout:\n%s\nstderr:\n%s", p.err, p.stdout, p.stderr)
	case <-time.After(within):
		t.Fatalf("outbox dev not ready after %s\nstdout:\n%s\nstderr:\n%s", within, p.stdout, p.stderr)
	}
}

// interrupt sends SIGINT and waits for the process to exit.
func (p *devProcess) interrupt(t *testing.T, within time.Duration) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	select {
	case <-p.exited:
		require.NoError(t, p.err, "stderr:\n%s", p.stderr)
	case <-time.After(within):
		t.Fatalf("outbox dev did not exit within %s of SIGINT\nstderr:\n%s", within, p.stderr)
	}
}

var pgPIDPattern = regexp.MustCompile(`(postgres://\S+)\s+\(pid (\d+),`)

func alive(pid int) bool {
	// Signal 0 only checks; a zombie would still count, but the process is not our child.
	return syscall.Kill(pid, 0) == nil
}

// devEnv is the environment of the test process without what dev must not see.
func devEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DATABASE_URL=") || strings.HasPrefix(kv, "TEMPORAL_ADDRESS=") || strings.HasPrefix(kv, "OUTBOX_PG_BIN_DIR=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// devDir returns a dev folder (not yet made) removed when the test ends. PostgreSQL may run
// as another user than the test (when the test runs as root), so the folder must be
// reachable by others: not in t.TempDir, which is private.
func devDir(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "outbox-dev-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	return filepath.Join(base, "dev")
}

// TestDev runs `outbox dev` as a user does: an order goes through the demo and the outbox,
// the workflow is visible through Temporal and the UI answers; SIGINT stops everything,
// PostgreSQL included; a restart keeps the data.
func TestDev(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)

	dir := devDir(t)

	ports := testutil.FreePorts(t, 7)
	args := []string{
		"--dir", dir, "--temporal-server", "builtin",
		"--port", strconv.Itoa(ports[0]), "--history-port", strconv.Itoa(ports[1]),
		"--matching-port", strconv.Itoa(ports[2]), "--worker-port", strconv.Itoa(ports[3]),
		"--ui-port", strconv.Itoa(ports[4]),
		"--orders-addr", fmt.Sprintf("127.0.0.1:%d", ports[5]),
		"--inventory-addr", fmt.Sprintf("127.0.0.1:%d", ports[6]),
	}
	frontend := fmt.Sprintf("127.0.0.1:%d", ports[0])
	ordersURL := fmt.Sprintf("http://127.0.0.1:%d", ports[5])
	inventoryURL := fmt.Sprintf("http://127.0.0.1:%d", ports[6])
	uiURL := fmt.Sprintf("http://127.0.0.1:%d", ports[4])
	ctx := context.Background()

	p := startDev(t, bin, devEnv(), args...)
	p.waitReady(t)
	m := pgPIDPattern.FindStringSubmatch(p.stdout.String())
	require.NotNil(t, m, "the summary names PostgreSQL's URL and pid:\n%s", p.stdout)
	dbURL := m[1]
	pgPID, _ := strconv.Atoi(m[2])
	require.True(t, alive(pgPID))

	// An order through the demo API.
	resp, err := http.Post(ordersURL+"/orders", "application/json", strings.NewReader(`{"sku": "SKU-7", "qty": 3}`))
	require.NoError(t, err)
	var order struct {
		OrderID              int64     `json:"order_id"`
		MessageID            uuid.UUID `json:"message_id"`
		FulfilmentWorkflowID string    `json:"fulfilment_workflow_id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&order))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// Delivered: the row is sent and the receiver has it.
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var status string
		require.NoError(t, conn.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE message_id = $1`, order.MessageID).Scan(&status))
		return status == "sent"
	}, 60*time.Second, 100*time.Millisecond, "stderr:\n%s", p.stderr)
	resp, err = http.Get(inventoryURL + "/events/" + order.MessageID.String())
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// The same order reached the demo teams: their topics' rows are sent too, by the
	// loyalty team's activity and by starting the fulfilment team's workflow.
	require.Eventually(t, func() bool {
		var sent int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE topic IN ('order.points', 'order.fulfil')
			AND payload->>'order_id' = $1 AND status = 'sent'`, strconv.FormatInt(order.OrderID, 10)).Scan(&sent))
		return sent == 2
	}, 60*time.Second, 100*time.Millisecond, "stderr:\n%s", p.stderr)
	require.Equal(t, fmt.Sprintf("fulfil-order-%d", order.OrderID), order.FulfilmentWorkflowID)
	conn.Close(ctx)

	// The workflow, through the Temporal frontend.
	c, err := client.Dial(client.Options{HostPort: frontend, Namespace: "default"})
	require.NoError(t, err)
	desc := describeClosed(t, c, workflows.WorkflowID(order.MessageID.String()))
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	c.Close()

	// The Web UI's HTML.
	resp, err = http.Get(uiURL + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, strings.ToLower(string(body)), "<html")

	// SIGINT stops everything, PostgreSQL included.
	p.interrupt(t, 60*time.Second)
	require.Eventually(t, func() bool { return !alive(pgPID) }, 10*time.Second, 50*time.Millisecond, "PostgreSQL outlived outbox dev")
	// Temporal's state is a SQLite database in WAL mode: its header's file format
	// versions (bytes 18 and 19) are 2, where a rollback-journal database has 1.
	f, err := os.Open(filepath.Join(dir, "temporal.db"))
	require.NoError(t, err)
	header := make([]byte, 20)
	_, err = io.ReadFull(f, header)
	f.Close()
	require.NoError(t, err)
	require.Equal(t, []byte{2, 2}, header[18:20], "temporal.db is in WAL mode")

	// A restart on the same folder keeps the messages table and the workflow histories.
	p = startDev(t, bin, devEnv(), args...)
	p.waitReady(t)
	m = pgPIDPattern.FindStringSubmatch(p.stdout.String())
	require.NotNil(t, m)
	conn, err = pgx.Connect(ctx, m[1])
	require.NoError(t, err)
	var status string
	require.NoError(t, conn.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE message_id = $1`, order.MessageID).Scan(&status))
	require.Equal(t, "sent", status)
	conn.Close(ctx)
	c, err = client.Dial(client.Options{HostPort: frontend, Namespace: "default"})
	require.NoError(t, err)
	desc, err = c.DescribeWorkflowExecution(ctx, workflows.WorkflowID(order.MessageID.String()), "")
	require.NoError(t, err)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	iter := c.GetWorkflowHistory(ctx, workflows.WorkflowID(order.MessageID.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	events := 0
	for iter.HasNext() {
		_, err := iter.Next()
		require.NoError(t, err)
		events++
	}
	require.Greater(t, events, 5, "the history survived the restart")
	c.Close()
	pgPID, _ = strconv.Atoi(m[2])
	p.interrupt(t, 60*time.Second)
	require.Eventually(t, func() bool { return !alive(pgPID) }, 10*time.Second, 50*time.Millisecond)
}

// TestDevWithoutPostgreSQL checks the error when no PostgreSQL programs can be found.
func TestDevWithoutPostgreSQL(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	empty := t.TempDir()
	dir := filepath.Join(t.TempDir(), "dev")
	var env []string
	for _, kv := range devEnv() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+empty)
	ports := testutil.FreePorts(t, 1)

	cmd := exec.Command(bin, "dev", "--dir", dir, "--pg-bin-dir", empty, "--port", strconv.Itoa(ports[0]))
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", out)
	require.NotZero(t, exitErr.ExitCode())
	require.Contains(t, string(out), "PostgreSQL server programs (initdb, postgres) are not in "+empty)
	require.Contains(t, string(out), "apt-get install postgresql")
	require.Contains(t, string(out), "OUTBOX_PG_BIN_DIR")

	// Nothing is left running: Temporal's port is free again, and no postgres uses the folder.
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	require.NoError(t, err)
	l.Close()
	procs, _ := exec.Command("pgrep", "-f", dir).Output()
	require.Empty(t, strings.TrimSpace(string(procs)))
}

// TestDevWithAnEarlierSessionsEnvironment: in a shell that sourced an earlier outbox dev's
// env file, outbox dev uses DATABASE_URL and TEMPORAL_ADDRESS instead of starting its own
// servers; when they are gone, the error says so and what to unset.
func TestDevWithAnEarlierSessionsEnvironment(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	ports := testutil.FreePorts(t, 3)
	env := append(devEnv(),
		fmt.Sprintf("DATABASE_URL=postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", ports[0]),
		fmt.Sprintf("TEMPORAL_ADDRESS=127.0.0.1:%d", ports[1]))
	cmd := exec.Command(bin, "dev", "--dir", filepath.Join(t.TempDir(), "dev"), "--port", strconv.Itoa(ports[2]))
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", out)
	require.NotZero(t, exitErr.ExitCode())
	require.Contains(t, string(out), fmt.Sprintf("connect to PostgreSQL at 127.0.0.1:%d", ports[0]))
	require.Contains(t, string(out), "unset DATABASE_URL and TEMPORAL_ADDRESS to let outbox dev start its own")
}

// TestDevBroker: outbox dev --broker nats, with no NATS server at --nats-url, starts
// nats-server with JetStream in the dev folder, and each demo order reaches the demo stream
// with its message ID as Nats-Msg-Id.
func TestDevBroker(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	ports := testutil.FreePorts(t, 8)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", ports[7])
	p := startDev(t, bin, devEnv(), "--dir", devDir(t), "--ephemeral", "--broker", "nats", "--nats-url", natsURL,
		"--port", strconv.Itoa(ports[0]), "--history-port", strconv.Itoa(ports[1]),
		"--matching-port", strconv.Itoa(ports[2]), "--worker-port", strconv.Itoa(ports[3]), "--ui-port", "0",
		"--orders-addr", fmt.Sprintf("127.0.0.1:%d", ports[5]), "--inventory-addr", fmt.Sprintf("127.0.0.1:%d", ports[6]))
	p.waitReady(t)
	require.Contains(t, p.stdout.String(), "NATS server")
	require.Contains(t, p.stdout.String(), "stream OUTBOX_DEMO")

	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/orders", ports[5]), "application/json", strings.NewReader(`{"sku": "SKU-9", "qty": 1}`))
	require.NoError(t, err)
	var order struct {
		Placed uuid.UUID `json:"placed_message_id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&order))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.NotEqual(t, uuid.Nil, order.Placed)

	nc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var msg *jetstream.RawStreamMsg
	require.Eventually(t, func() bool {
		st, err := js.Stream(ctx, "OUTBOX_DEMO")
		if err != nil {
			return false
		}
		msg, err = st.GetLastMsgForSubject(ctx, "demo.order.placed")
		return err == nil
	}, time.Minute, 100*time.Millisecond, "stderr:\n%s", p.stderr)
	require.Equal(t, order.Placed.String(), msg.Header.Get(jetstream.MsgIDHeader))
	require.JSONEq(t, `{"order_id": 1, "sku": "SKU-9", "qty": 1}`, string(msg.Data))
	require.Eventually(t, func() bool {
		return strings.Contains(p.stderr.String(), "Demo NATS consumer: message arrived")
	}, 10*time.Second, 50*time.Millisecond, "the demo consumer logs the arrival")

	// SIGINT stops the NATS server dev started with the rest.
	m := regexp.MustCompile(`NATS server\s+pid (\d+)`).FindStringSubmatch(p.stdout.String())
	require.NotNil(t, m, "the summary names the NATS server's pid:\n%s", p.stdout)
	natsPID, _ := strconv.Atoi(m[1])
	p.interrupt(t, 60*time.Second)
	require.Eventually(t, func() bool { return !alive(natsPID) }, 15*time.Second, 50*time.Millisecond, "nats-server %d still runs", natsPID)
}
