package localserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

// Process is a database server running as a child process of outbox dev, its output
// appended to a log file.
type Process struct {
	cmd      *exec.Cmd
	stop     os.Signal
	exited   chan struct{}
	logFile  *os.File
	stopOnce sync.Once
}

// Start starts cmd (its SysProcAttr set by the caller) with its standard output and error
// appended to logPath; Stop sends it stop, its way to shut down cleanly. A parent-death
// signal in cmd's SysProcAttr fires when the thread that started the child ends, so Start
// starts and waits for the child on one locked thread that lives exactly as long as it.
func Start(cmd *exec.Cmd, logPath string, stop os.Signal) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	p := &Process{cmd: cmd, stop: stop, exited: make(chan struct{}), logFile: logFile}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer close(p.exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return p, nil
}

// WaitReady calls ping until it succeeds, for at most 60 seconds. When the process exits
// first, the error quotes the end of the log at logPath (which may be the server's own
// log, not the one Start wrote to); on every failure the process is stopped.
func (p *Process) WaitReady(ctx context.Context, logPath string, ping func(ctx context.Context) error) error {
	name := filepath.Base(p.cmd.Path)
	deadline := time.Now().Add(60 * time.Second)
	for {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := ping(pingCtx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			p.Stop()
			return fmt.Errorf("%s exited at start; its log %s ends with:\n%s", name, logPath, Tail(logPath, 10))
		case <-ctx.Done():
			p.Stop()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return fmt.Errorf("%s did not accept connections within 60s (last error: %v); see %s", name, err, logPath)
		}
	}
}

// Stop shuts the server down with the stop signal, killing it if it takes more than 30
// seconds. Calls after the first do nothing.
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(p.stop)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		p.logFile.Close()
	})
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// PID returns the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }
