package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The outbox command's exit codes (cmd/outbox/internal/cli/exit.go; the e2e module may not
// import the command's packages, so the tests write the numbers):
// 0 ok, 1 failure, 64 usage, 69 unavailable, 78 config.

// outboxProcess is the outbox binary running as a child process of a test, as a script or
// a supervisor runs it.
type outboxProcess struct {
	cmd  *exec.Cmd
	out  *syncBuffer   // its standard output and standard error, interleaved as written
	done chan struct{} // closed once it has exited
}

// startOutbox starts the outbox binary (built once per test run) with args. stdin is its
// standard input; env is its whole environment, so that the command reads no variable of
// the test's (TEMPORAL_*, OUTBOX_*, HOME and its temporal.toml) but those the test sets.
// Only the PG* variables of the test's environment, libpq's defaults under DATABASE_URL,
// are passed on, as the test's own connections use them. The process is killed when the
// test ends if it still runs.
func startOutbox(t *testing.T, stdin string, env map[string]string, args ...string) *outboxProcess {
	t.Helper()
	bin, err := buildOutbox()
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	cmd.Env = []string{} // not nil: nil would be the test's environment
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &outboxProcess{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.WaitDelay = 10 * time.Second
	require.NoError(t, cmd.Start(), "outbox %s", strings.Join(args, " "))
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to end and returns its exit code (-1 when a signal ended it).
func (p *outboxProcess) wait() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// waitWithin is wait for at most d; exited is false if the process still runs then.
func (p *outboxProcess) waitWithin(d time.Duration) (code int, exited bool) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), true
	case <-time.After(d):
		return -1, false
	}
}

// interrupt sends SIGINT, as Ctrl-C does (the command stops as it does when its context is
// cancelled), and waits at most within for the process to end.
func (p *outboxProcess) interrupt(within time.Duration) (code int, exited bool) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(os.Interrupt)
	}
	return p.waitWithin(within)
}

// runOutbox runs the outbox binary (see startOutbox) to its end and returns what it printed
// and its exit code. A command still running after timeout is interrupted, as a deadline
// stops it, and killed if it does not end 30s later (exit code -1).
func runOutbox(t *testing.T, timeout time.Duration, stdin string, env map[string]string, args ...string) (string, int) {
	t.Helper()
	p := startOutbox(t, stdin, env, args...)
	code, exited := p.waitWithin(timeout)
	if !exited {
		if code, exited = p.interrupt(30 * time.Second); !exited {
			_ = p.cmd.Process.Kill()
			code = p.wait()
		}
	}
	return p.out.String(), code
}
