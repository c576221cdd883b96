//go:build linux

package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/pgcluster"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/store"
)

const topic = "chaos.event"

var (
	outboxBin string // built once in TestMain
	pgBinDir  string // "" when no PostgreSQL server programs were found
	pgCred    *syscall.Credential
	setupErr  error // why the suite cannot run here (tests skip with it)

	summaryMu sync.Mutex
	summary   []summaryRow
)

type summaryRow struct {
	fault                            string
	messages, sent, dead, lost, dups int
	uncertain, retried, receiverReqs int
	wall                             time.Duration
}

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "outbox-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(tmp)
		outboxBin, err = testutil.BuildOutbox(tmp)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 1
		}
		pgBinDir, setupErr = pgcluster.FindBinDir(os.Getenv("OUTBOX_PG_BIN_DIR"), exec.LookPath)
		if setupErr == nil {
			pgCred, setupErr = unprivilegedUser()
		}
		code := m.Run()
		printSummary()
		return code
	}()
	os.Exit(code)
}

// unprivilegedUser is the credential PostgreSQL runs with when the test runs as root.
func unprivilegedUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("running as root and there is no postgres system user to run PostgreSQL as")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func messagesPerFault(t *testing.T) int {
	s := os.Getenv("OUTBOX_CHAOS_MESSAGES")
	if s == "" {
		return 100
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "OUTBOX_CHAOS_MESSAGES=%q", s)
	require.Positive(t, n)
	return n
}

// ---------------------------------------------------------------------------------------
// Processes.

// patternWriter keeps what a process writes (in a log file and in memory) and closes
// ready when pattern appears.
type patternWriter struct {
	mu      sync.Mutex
	file    *os.File
	buf     bytes.Buffer
	pattern string
	ready   chan struct{}
	seen    bool
}

func (w *patternWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.file.Write(p)
	w.buf.Write(p)
	if w.buf.Len() > 1<<20 { // keep the tail only
		tail := append([]byte(nil), w.buf.Bytes()[w.buf.Len()-(1<<19):]...)
		w.buf.Reset()
		w.buf.Write(tail)
	}
	if !w.seen && w.pattern != "" && bytes.Contains(w.buf.Bytes(), []byte(w.pattern)) {
		w.seen = true
		close(w.ready)
	}
	return len(p), nil
}

func (w *patternWriter) tail(lines int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ls := strings.Split(strings.TrimRight(w.buf.String(), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// proc is a child process. It is started and waited for on one locked OS thread, so its
// parent-death signal fires only when the test process dies.
type proc struct {
	name   string
	cmd    *exec.Cmd
	out    *patternWriter
	exited chan struct{}
	err    error
}

type procSpec struct {
	name    string
	path    string
	args    []string
	env     []string
	cred    *syscall.Credential
	dir     string
	logPath string
	ready   string        // text on stdout/stderr that means ready; "" = started is ready
	within  time.Duration // how long to wait for ready
}

func startProc(s procSpec) (*proc, error) {
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p := &proc{name: s.name, exited: make(chan struct{}),
		out: &patternWriter{file: f, pattern: s.ready, ready: make(chan struct{})}}
	p.cmd = exec.Command(s.path, s.args...)
	p.cmd.Env = s.env
	p.cmd.Dir = s.dir
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer close(p.exited)
		if err := p.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = p.cmd.Wait()
		_ = f.Close()
	}()
	if err := <-started; err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", s.name, err)
	}
	if s.ready == "" {
		return p, nil
	}
	select {
	case <-p.out.ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s exited before it was ready (%v):\n%s", s.name, p.err, p.out.tail(30))
	case <-time.After(s.within):
		p.kill()
		return nil, fmt.Errorf("%s not ready within %s:\n%s", s.name, s.within, p.out.tail(30))
	}
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// stop sends sig and waits up to within, then kills.
func (p *proc) stop(sig syscall.Signal, within time.Duration) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(within):
		p.kill()
	}
}

// ---------------------------------------------------------------------------------------
// The environment of one fault: PostgreSQL, Temporal, worker, relay, receiver.

type chaosEnv struct {
	t         *testing.T
	base      string // reachable by the postgres user
	pgPort    int
	pgData    string
	pg        *proc
	pgStarts  int
	temporal  *proc
	tempArgs  []string
	frontend  string
	dbURL     string
	config    string
	taskQueue string
	rcv       *receiver
	// downstream is what reached the healthy topic's downstream: the receiver's record,
	// or a broker's.
	downstream func() testutil.Snapshot
	pool       *pgxpool.Pool
	store      *store.Store

	mu sync.Mutex
	// commands are the outbox processes the env runs: worker and relay, or run (both in
	// one process); a name may end in #N to run a command more than once ("run#2").
	// outbox holds each one's current process.
	commands []string
	outbox   map[string]*proc
	starts   map[string]int
}

// oneProcess is a prepare function of newEnvSink: the env runs `outbox run` (worker and
// relay in one process, eager start) instead of `outbox worker` and `outbox relay`.
func oneProcess(e *chaosEnv) { e.commands = []string{"run"} }

// twoProcesses is a prepare function of newEnvSink: the env runs two `outbox run`
// processes against the same database, namespace and task queue.
func twoProcesses(e *chaosEnv) { e.commands = []string{"run", "run#2"} }

func newEnv(t *testing.T) *chaosEnv { return newEnvWith(t, "") }

// fastPolicy is the healthy topic's policy in most faults: short waits, so a run takes
// seconds, and enough attempts (about 33s of waits) that no fault dead-letters a healthy
// message.
const fastPolicy = `    max_attempts: 20
    initial_interval: 100ms
    backoff: 2
    max_interval: 2s
    timeout: 2s
`

// newEnvWith is newEnv with extra YAML appended to the config: more topics (indented
// under topics:) followed by other top-level sections.
func newEnvWith(t *testing.T, extraConfig string) *chaosEnv {
	t.Helper()
	return newEnvPolicy(t, fastPolicy, extraConfig)
}

// newEnvPolicy is newEnvWith with the healthy topic's policy lines (indented under the
// topic); "" leaves it the default policy.
func newEnvPolicy(t *testing.T, policy, extraConfig string) *chaosEnv {
	t.Helper()
	return newEnvSink(t, httpSink, policy, extraConfig)
}

// httpSink is the healthy topic's sink: the receiver (RECEIVER is its URL).
const httpSink = `    sink: http
    url: RECEIVER/events
    check_url: RECEIVER/events/{message_id}
`

// newEnvSink is newEnvPolicy with the healthy topic's sink lines (indented under the
// topic; RECEIVER is the receiver's URL). Before the worker starts, prepare runs (when not
// nil) with the env, to start what the sink needs.
func newEnvSink(t *testing.T, sink, policy, extraConfig string, prepare ...func(*chaosEnv)) *chaosEnv {
	t.Helper()
	if setupErr != nil {
		t.Skipf("chaos suite cannot run here: %v", setupErr)
	}
	base, err := os.MkdirTemp("", "outbox-chaos-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o755))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", base)
			return
		}
		_ = os.RemoveAll(base)
	})
	ports := testutil.FreePorts(t, 5)
	e := &chaosEnv{t: t, base: base, pgPort: ports[0], pgData: filepath.Join(base, "pgdata"),
		taskQueue: "chaos-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")),
		commands:  []string{"worker", "relay"}, outbox: map[string]*proc{}, starts: map[string]int{}}
	e.dbURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", e.pgPort)
	e.frontend = fmt.Sprintf("127.0.0.1:%d", ports[1])

	// PostgreSQL.
	require.NoError(t, os.MkdirAll(e.pgData, 0o700))
	if pgCred != nil {
		require.NoError(t, os.Chown(e.pgData, int(pgCred.Uid), int(pgCred.Gid)))
	}
	initdb := exec.Command(filepath.Join(pgBinDir, "initdb"), "-D", e.pgData, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: pgCred}
	initdb.Dir = base
	out, err := initdb.CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	require.NoError(t, e.startPG())
	t.Cleanup(func() {
		if e.pg != nil {
			e.pg.stop(syscall.SIGINT, 30*time.Second)
		}
	})

	// Temporal, its state in base/temporal (it survives a restart of the process).
	// The built-in server, whatever is installed: the faults were measured against it.
	e.tempArgs = []string{"dev", "--only", "temporal", "--temporal-server", "builtin", "--dir", filepath.Join(base, "temporal"),
		"--port", strconv.Itoa(ports[1]), "--history-port", strconv.Itoa(ports[2]),
		"--matching-port", strconv.Itoa(ports[3]), "--worker-port", strconv.Itoa(ports[4]),
		"--ui-port", "0"}
	e.startTemporal()
	t.Cleanup(func() {
		if e.temporal != nil {
			e.temporal.stop(syscall.SIGINT, 30*time.Second)
		}
	})

	// The receiver and the config.
	e.rcv = newReceiver()
	t.Cleanup(e.rcv.close)
	e.config = filepath.Join(base, "outbox.yaml")
	require.NoError(t, os.WriteFile(e.config, []byte(fmt.Sprintf(`# written by the chaos suite
relay:
  poll_interval: 200ms
  lease: 5s
  reconcile_after: 3s
  reconcile_interval: 500ms
topics:
  %s:
%s%s%s`, topic, strings.ReplaceAll(sink, "RECEIVER", e.rcv.url), policy, strings.ReplaceAll(extraConfig, "RECEIVER", e.rcv.url))), 0o644))
	e.downstream = e.rcv.Snapshot
	for _, p := range prepare {
		p(e)
	}

	// Migrate, the business table, worker and relay.
	mig := exec.Command(outboxBin, "migrate", "--config", e.config)
	mig.Env = e.outboxEnv()
	out, err = mig.CombinedOutput()
	require.NoError(t, err, "outbox migrate: %s", out)

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, e.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e.pool = pool
	_, err = pool.Exec(ctx, `CREATE TABLE chaos_orders (id bigserial PRIMARY KEY, seq int NOT NULL, message_id uuid NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	e.store, err = store.New(pool, store.Config{})
	require.NoError(t, err)

	for _, c := range e.commands {
		require.NoError(t, e.startOutbox(c))
	}
	t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, c := range slices.Backward(e.commands) {
			if p := e.outbox[c]; p != nil {
				p.stop(syscall.SIGINT, 15*time.Second)
			}
		}
	})
	return e
}

func (e *chaosEnv) outboxEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "DATABASE_URL="), strings.HasPrefix(kv, "TEMPORAL_"),
			strings.HasPrefix(kv, "OUTBOX_"), strings.HasPrefix(kv, "PG"):
			continue
		}
		env = append(env, kv)
	}
	return append(env, "DATABASE_URL="+e.dbURL, "TEMPORAL_ADDRESS="+e.frontend,
		"TEMPORAL_NAMESPACE=default", "OUTBOX_TASK_QUEUE="+e.taskQueue)
}

// startPG starts the postmaster and waits until it accepts connections. It may run on a
// fault's goroutine, so it returns its error instead of failing the test.
func (e *chaosEnv) startPG() error {
	e.pgStarts++
	p, err := startProc(procSpec{
		name: "postgres", path: filepath.Join(pgBinDir, "postgres"),
		args: []string{"-D", e.pgData, "-p", strconv.Itoa(e.pgPort),
			"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
			"-c", "max_connections=200", "-c", "fsync=off"},
		cred: pgCred, dir: e.base, logPath: filepath.Join(e.base, "postgres.log"),
		ready: "ready to accept connections", within: 60 * time.Second,
	})
	if err != nil {
		return err
	}
	e.pg = p
	// The log line comes just before the port accepts; make sure it does.
	if !waitFor(30*time.Second, func() bool {
		conn, err := pgx.Connect(context.Background(), e.dbURL)
		if err != nil {
			return false
		}
		conn.Close(context.Background())
		return true
	}) {
		return fmt.Errorf("postgres does not accept connections on %s", e.dbURL)
	}
	return nil
}

// restartPG stops PostgreSQL with a fast shutdown (SIGINT to the postmaster) and starts it
// again on the same port and data folder; it returns how long it was down.
func (e *chaosEnv) restartPG(pause time.Duration) (time.Duration, error) {
	start := time.Now()
	e.pg.stop(syscall.SIGINT, 30*time.Second)
	time.Sleep(pause)
	err := e.startPG()
	return time.Since(start), err
}

func (e *chaosEnv) startTemporal() {
	e.t.Helper()
	require.NoError(e.t, e.launchTemporal())
}

// launchTemporal starts the Temporal process on its ports and folder. It may run on a
// fault's goroutine, so it returns its error.
func (e *chaosEnv) launchTemporal() error {
	e.mu.Lock()
	e.starts["temporal"]++
	n := e.starts["temporal"]
	e.mu.Unlock()
	p, err := startProc(procSpec{
		name: "temporal", path: outboxBin, args: e.tempArgs, env: e.outboxEnvWithout(),
		dir: e.base, logPath: filepath.Join(e.base, fmt.Sprintf("temporal-dev-%d.log", n)),
		ready: "is ready", within: 120 * time.Second,
	})
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.temporal = p
	e.mu.Unlock()
	return nil
}

// restartTemporal stops the Temporal process (SIGINT), waits pause and starts it again on
// the same ports and folder; its state survives.
func (e *chaosEnv) restartTemporal(pause time.Duration) (time.Duration, error) {
	start := time.Now()
	e.mu.Lock()
	p := e.temporal
	e.mu.Unlock()
	p.stop(syscall.SIGINT, 30*time.Second)
	time.Sleep(pause)
	err := e.launchTemporal()
	return time.Since(start), err
}

// outboxEnvWithout is the environment for `outbox dev`: none of the outbox variables.
func (e *chaosEnv) outboxEnvWithout() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DATABASE_URL=") || strings.HasPrefix(kv, "TEMPORAL_") || strings.HasPrefix(kv, "OUTBOX_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// startOutbox starts `outbox worker`, `outbox relay` or `outbox run` and waits until it
// logs that it started. It may run on a fault's goroutine, so it returns its error.
func (e *chaosEnv) startOutbox(which string) error {
	command, _, _ := strings.Cut(which, "#")
	ready := map[string]string{"worker": "Worker started", "relay": "Relay started", "run": "Worker started"}[command]
	e.mu.Lock()
	e.starts[which]++
	n := e.starts[which]
	e.mu.Unlock()
	p, err := startProc(procSpec{
		name: which, path: outboxBin, args: []string{command, "--config", e.config},
		env: e.outboxEnv(), dir: e.base,
		logPath: filepath.Join(e.base, fmt.Sprintf("%s-%d.log", strings.ReplaceAll(which, "#", "-"), n)),
		ready:   ready, within: 60 * time.Second,
	})
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.outbox[which] = p
	return nil
}

// killOutbox SIGKILLs the worker, the relay or the run process and starts a new one
// after pause.
func (e *chaosEnv) killOutbox(which string, pause time.Duration) error {
	e.mu.Lock()
	p := e.outbox[which]
	e.mu.Unlock()
	if !p.alive() {
		e.t.Errorf("%s had exited before it was killed (%v):\n%s", which, p.err, p.out.tail(30))
	}
	p.kill()
	time.Sleep(pause)
	return e.startOutbox(which)
}

// checkAlive reports an outbox process that exited on its own (it must ride out faults).
func (e *chaosEnv) checkAlive() {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.commands {
		if p := e.outbox[c]; !p.alive() {
			e.t.Errorf("%s exited by itself (%v); its output ends with:\n%s", p.name, p.err, p.out.tail(30))
		}
	}
}

func printSummary() {
	summaryMu.Lock()
	defer summaryMu.Unlock()
	if len(summary) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nchaos summary\n%-20s %8s %8s %6s %6s %10s %10s %10s %9s %9s\n",
		"FAULT", "MESSAGES", "SENT", "DEAD", "LOST", "DUPLICATES", "REQUESTS", "UNCERTAIN", "TX-RETRY", "WALL")
	for _, r := range summary {
		fmt.Fprintf(&b, "%-20s %8d %8d %6d %6d %10d %10d %10d %9d %9s\n",
			r.fault, r.messages, r.sent, r.dead, r.lost, r.dups, r.receiverReqs, r.uncertain, r.retried,
			r.wall.Round(100*time.Millisecond))
	}
	for _, note := range latencyNotes {
		fmt.Fprintf(&b, "%s\n", note)
	}
	_, _ = os.Stdout.WriteString(b.String())
}
