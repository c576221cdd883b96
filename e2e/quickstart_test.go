package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/workflows"
)

// quickStartPorts are the ports `outbox dev` listens on by default, with the flag that
// moves each one.
var quickStartPorts = []struct {
	flag string
	port int
}{
	{"--port", 7233}, {"--history-port", 7234}, {"--matching-port", 7235}, {"--worker-port", 7236},
	{"--ui-port", 8233}, {"--orders-addr", 8080}, {"--inventory-addr", 8081},
}

// TestQuickStart runs the README's quick start as a new user does: from a fresh folder
// standing in for a checkout, `outbox dev` with no --dir and, where the default ports are
// free, no port flags; the README's curl places an order, its message is delivered, and
// Ctrl-C leaves no process behind. GoRun runs `go run ./cmd/outbox dev` verbatim in a copy
// of the checkout kept in a folder only its owner may enter (so, as root, PostgreSQL's
// user cannot reach it); OtherUser runs the built binary as an unprivileged user, when the
// test runs as root and the machine has one.
func TestQuickStart(t *testing.T) {
	t.Parallel()

	// Without the Temporal CLI, outbox dev builds its own Temporal server on first use.
	t.Run("GoRun", func(t *testing.T) { goRunQuickStart(t, withoutTemporalCLI(devEnv())) })
	// With the Temporal CLI on PATH, outbox dev runs its development server: only the
	// light outbox binary is built.
	t.Run("GoRunWithTemporalCLI", func(t *testing.T) { goRunQuickStart(t, withTemporalCLI(t, devEnv())) })

	t.Run("OtherUser", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("runs only as root: GoRun already ran as this unprivileged user")
		}
		u := unprivilegedTestUser(t)
		bin, err := buildOutbox()
		require.NoError(t, err)

		// The binary and the user's folders where the user may reach them.
		base, err := os.MkdirTemp("", "outbox-quickstart-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(base) })
		require.NoError(t, os.Chmod(base, 0o755))
		userBin := filepath.Join(base, "outbox")
		require.NoError(t, copyFile(bin, userBin, 0o755))
		home, checkout := filepath.Join(base, "home"), filepath.Join(base, "checkout")
		for _, d := range []string{home, checkout} {
			require.NoError(t, os.Mkdir(d, 0o700))
			require.NoError(t, os.Chown(d, int(u.Uid), int(u.Gid)))
		}

		// Outside a checkout outbox dev cannot build its own server: this user has the
		// Temporal CLI, as a team on Temporal does, beside the outbox binary.
		cliPath := withTemporalCLIPath(t)
		require.NoError(t, copyFile(cliPath, filepath.Join(base, "temporal"), 0o755))
		cmd := exec.Command(userBin, append([]string{"dev"}, portFlags(t)...)...)
		cmd.Dir = checkout
		cmd.Env = append(prependPath(base, devEnv()), "HOME="+home, "USER="+u.name, "LOGNAME="+u.name)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: u.Uid, Gid: u.Gid}}
		p := startDevCmd(t, cmd)
		p.waitReady(t)
		qs := checkQuickStart(t, p, checkout)
		p.interruptGroup(t, 60*time.Second)
		qs.requireNothingLeft(t, p)
	})
}

// goRunQuickStart runs `go run ./cmd/outbox dev` verbatim in a copy of the checkout with
// env, checks the quick start and stops it; it logs how long outbox dev took to be ready,
// the build included.
func goRunQuickStart(t *testing.T, env []string) {
	checkout := copyCheckout(t)
	cmd := exec.Command("go", "run", "./cmd/outbox", "dev")
	cmd.Dir = checkout
	cmd.Args = append(cmd.Args, portFlags(t)...)
	cmd.Env = env
	// Ctrl-C in a terminal signals the whole foreground process group: go run and
	// the program it runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	p := startDevCmd(t, cmd)
	// The first go run in a new folder compiles the module's packages and links the
	// binary (and, without the Temporal CLI, the built-in server).
	p.waitReadyWithin(t, 10*time.Minute)
	t.Logf("outbox dev was ready %s after go run started", time.Since(start).Round(100*time.Millisecond))
	qs := checkQuickStart(t, p, checkout)

	// The README's enqueue example runs against the running outbox dev, with the
	// environment it wrote; its message is delivered too.
	devVars := readDevEnv(t, filepath.Join(checkout, ".outbox-dev", "env"))
	out, err := runIn(checkout, append(env, devVars...), "go", "run", "./examples/enqueue")
	require.NoError(t, err, "%s", out)
	m := regexp.MustCompile(`order \d+ placed; message ([0-9a-f-]{36}) enqueued`).FindStringSubmatch(out)
	require.NotNil(t, m, "examples/enqueue printed:\n%s", out)
	qs.waitSent(t, m[1])

	p.interruptGroup(t, 60*time.Second)
	qs.requireNothingLeft(t, p)
}

// withTemporalCLI returns env with the Temporal CLI that scripts/services.sh provides
// first on PATH.
func withTemporalCLI(t *testing.T, env []string) []string {
	t.Helper()
	return prependPath(filepath.Dir(withTemporalCLIPath(t)), env)
}

// withTemporalCLIPath is the Temporal CLI that scripts/services.sh provides
// (OUTBOX_TEST_TEMPORAL_CLI).
func withTemporalCLIPath(t *testing.T) string {
	t.Helper()
	cli := os.Getenv("OUTBOX_TEST_TEMPORAL_CLI")
	if cli == "" {
		t.Fatal("OUTBOX_TEST_TEMPORAL_CLI is not set: run the tests with make test, whose scripts/services.sh installs the Temporal CLI and sets it")
	}
	return cli
}

// withoutTemporalCLI returns env with the folders that hold a temporal command left out of
// its PATH, as on a machine without the Temporal CLI.
func withoutTemporalCLI(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			var keep []string
			for _, dir := range filepath.SplitList(path) {
				if _, err := os.Stat(filepath.Join(dir, "temporal")); err != nil {
					keep = append(keep, dir)
				}
			}
			kv = "PATH=" + strings.Join(keep, string(os.PathListSeparator))
		}
		out = append(out, kv)
	}
	return out
}

// prependPath returns env with dir first on its PATH.
func prependPath(dir string, env []string) []string {
	out := []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH")}
	for _, kv := range env {
		if !strings.HasPrefix(kv, "PATH=") {
			out = append(out, kv)
		}
	}
	return out
}

// quickStart is what checkQuickStart learnt of a running outbox dev.
type quickStart struct {
	dir          string
	dbURL        string
	pgPID        int
	ports        []int
	inventoryURL string
}

// checkQuickStart does what the README's quick start says once outbox dev is ready in
// dir: the curl that places an order, then the reservation that shows it delivered.
func checkQuickStart(t *testing.T, p *devProcess, dir string) *quickStart {
	t.Helper()
	banner := p.stdout.String()
	t.Logf("outbox dev printed:\n%s", banner)
	m := pgPIDPattern.FindStringSubmatch(banner)
	require.NotNil(t, m, "the banner names PostgreSQL's URL and pid:\n%s", banner)
	qs := &quickStart{dir: dir, dbURL: m[1]}
	qs.pgPID, _ = strconv.Atoi(m[2])
	require.True(t, alive(qs.pgPID))
	require.Contains(t, banner, "log .outbox-dev/postgres.log", "paths in the banner are relative to the folder the user stands in")
	if data := regexp.MustCompile(`data in (\S+),`).FindStringSubmatch(banner); data != nil && filepath.IsAbs(data[1]) {
		// PostgreSQL's user cannot enter dir: its data went elsewhere, and the banner
		// says why.
		require.Contains(t, banner, "cannot enter "+dir)
		t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(data[1])) })
	}
	for _, f := range p.cmd.Args {
		if strings.HasPrefix(f, "--") {
			t.Logf("outbox dev flags: %v", p.cmd.Args)
			break
		}
	}

	urls := map[string]string{}
	for _, line := range strings.Split(banner, "\n") {
		for _, name := range []string{"Demo orders", "Demo inventory", "Temporal UI"} {
			if strings.HasPrefix(strings.TrimSpace(line), name) {
				urls[name] = regexp.MustCompile(`http://[0-9.:]+`).FindString(line)
			}
		}
	}
	qs.inventoryURL = urls["Demo inventory"]
	try := regexp.MustCompile(`curl -s -X POST (http://\S+/orders) -d '(.*)'`).FindStringSubmatch(banner)
	require.NotNil(t, try, "the banner shows the curl to try:\n%s", banner)
	require.Equal(t, urls["Demo orders"]+"/orders", try[1])

	// curl -s -X POST http://127.0.0.1:8080/orders -d '{"sku": "SKU-1", "qty": 2}'
	resp, err := http.Post(try[1], "application/x-www-form-urlencoded", strings.NewReader(try[2]))
	require.NoError(t, err)
	var order struct {
		MessageID  string `json:"message_id"`
		WorkflowID string `json:"workflow_id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&order))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, workflows.WorkflowID(order.MessageID), order.WorkflowID)
	qs.waitSent(t, order.MessageID)

	// The delivery's workflow completed, and the UI answers.
	addr := regexp.MustCompile(`Temporal\s+(\S+)\s+namespace`).FindStringSubmatch(banner)
	require.NotNil(t, addr)
	c, err := client.Dial(client.Options{HostPort: addr[1], Namespace: "default"})
	require.NoError(t, err)
	desc := describeClosed(t, c, order.WorkflowID)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	c.Close()
	resp, err = http.Get(urls["Temporal UI"] + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	for _, u := range []string{addr[1], urls["Temporal UI"], urls["Demo orders"], urls["Demo inventory"]} {
		_, port, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
		require.NoError(t, err)
		n, _ := strconv.Atoi(port)
		qs.ports = append(qs.ports, n)
	}
	return qs
}

// waitSent waits until the message's row is sent and the demo inventory lists its
// reservation, delivered once (curl -s http://127.0.0.1:8081/reservations).
func (qs *quickStart) waitSent(t *testing.T, messageID string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, qs.dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Eventually(t, func() bool {
		var status string
		err := conn.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE message_id = $1`, messageID).Scan(&status)
		return err == nil && status == "sent"
	}, 60*time.Second, 100*time.Millisecond, "message %s not sent", messageID)

	resp, err := http.Get(qs.inventoryURL + "/reservations")
	require.NoError(t, err)
	defer resp.Body.Close()
	var reservations []struct {
		MessageID  string `json:"message_id"`
		Deliveries int    `json:"deliveries"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&reservations))
	found := false
	for _, r := range reservations {
		if r.MessageID == messageID {
			found = true
			require.Equal(t, 1, r.Deliveries)
		}
	}
	require.True(t, found, "the inventory lists no reservation for %s: %+v", messageID, reservations)
}

// requireNothingLeft checks that outbox dev left no process behind: PostgreSQL is gone,
// nothing runs in its folder or its process group, and its ports are free again.
func (qs *quickStart) requireNothingLeft(t *testing.T, p *devProcess) {
	t.Helper()
	require.Eventually(t, func() bool { return !alive(qs.pgPID) }, 10*time.Second, 50*time.Millisecond, "PostgreSQL outlived outbox dev")
	require.Eventually(t, func() bool { return len(processesUsing(qs.dir, p.cmd.Process.Pid)) == 0 }, 10*time.Second, 50*time.Millisecond,
		"processes left behind: %v", processesUsing(qs.dir, p.cmd.Process.Pid))
	for _, port := range qs.ports {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		require.NoError(t, err, "port %d still taken after outbox dev stopped", port)
		l.Close()
	}
}

// processesUsing lists the processes whose working directory or command line is in dir,
// or that are in the process group pgid.
func processesUsing(dir string, pgid int) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.ReplaceAll(string(cmdline), "\x00", " ")
		g, _ := syscall.Getpgid(pid)
		if strings.HasPrefix(cwd, dir) || strings.Contains(args, dir) || g == pgid {
			out = append(out, fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(args)))
		}
	}
	return out
}

// interruptGroup sends SIGINT to the process group, as Ctrl-C in a terminal does, and
// waits for the process to exit. outbox dev shuts down cleanly: it logs so and prints
// no error. (go run itself exits with status 1 after an interrupt, silently, even when
// the program it ran exited 0.)
func (p *devProcess) interruptGroup(t *testing.T, within time.Duration) {
	t.Helper()
	require.NoError(t, syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT))
	select {
	case <-p.exited:
		if filepath.Base(p.cmd.Path) != "go" {
			require.NoError(t, p.err, "stderr:\n%s", p.stderr)
		}
		require.Contains(t, p.stderr.String(), `msg="Shutting down"`)
		require.NotContains(t, p.stderr.String(), "outbox: ", "outbox dev ended with an error")
		require.NotContains(t, p.stderr.String(), "exit status", "outbox dev ended with an error")
	case <-time.After(within):
		t.Fatalf("outbox dev did not exit within %s of Ctrl-C\nstderr:\n%s", within, p.stderr)
	}
}

// portFlags returns the flags that move the default ports that are taken on this machine
// (by a developer's own outbox dev, say), and says which; with every default free it
// returns none, as in the README.
func portFlags(t *testing.T) []string {
	t.Helper()
	var flags []string
	for _, p := range quickStartPorts {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p.port))
		if err == nil {
			l.Close()
			continue
		}
		free := testutil.FreePorts(t, 1)[0]
		t.Logf("default port %d (%s) is taken here; using %s %d instead", p.port, p.flag, p.flag, free)
		v := strconv.Itoa(free)
		if strings.HasSuffix(p.flag, "-addr") {
			v = "127.0.0.1:" + v
		}
		flags = append(flags, p.flag, v)
	}
	return flags
}

// copyCheckout copies the module (without .git and build output) into a new folder
// that only its owner may enter, as `mktemp -d` or a home folder is.
func copyCheckout(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	base, err := os.MkdirTemp("", "outbox-checkout-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o700))
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	dst := filepath.Join(base, "outbox")
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (rel == ".git" || rel == "bin" || d.Name() == ".outbox-dev") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return copyFile(path, target, info.Mode().Perm())
	})
	require.NoError(t, err)
	return dst
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// readDevEnv reads the export lines of the env file outbox dev writes, as `. file` would.
func readDevEnv(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "export ")
		if !ok {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		env = append(env, k+"="+strings.Trim(v, "'"))
	}
	require.NotEmpty(t, env, "%s has no export lines", path)
	return env
}

func runIn(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// testUser is an unprivileged user of this machine.
type testUser struct {
	name     string
	Uid, Gid uint32
}

// unprivilegedTestUser returns a user other than root to run outbox dev as: a regular
// login user when the machine has one, else nobody. It skips the test when there is none.
func unprivilegedTestUser(t *testing.T) testUser {
	t.Helper()
	candidates := []string{}
	if f, err := os.Open("/etc/passwd"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) < 7 {
				continue
			}
			uid, err := strconv.Atoi(fields[2])
			if err == nil && uid >= 1000 && uid < 65534 && !strings.HasSuffix(fields[6], "nologin") && !strings.HasSuffix(fields[6], "false") {
				candidates = append(candidates, fields[0])
			}
		}
		f.Close()
	}
	candidates = append(candidates, "nobody")
	for _, name := range candidates {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		t.Logf("running outbox dev as user %s (uid %d)", name, uid)
		return testUser{name: name, Uid: uint32(uid), Gid: uint32(gid)}
	}
	t.Skip("this machine has no unprivileged user")
	return testUser{}
}
