//go:build unix

package dev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgCluster is a private PostgreSQL cluster that lives in a folder of the dev directory.
type pgCluster struct {
	binDir  string
	dataDir string
	port    int
	cred    *syscall.Credential // nil: run as the current user
	cmd     *exec.Cmd
	exited  chan struct{}
	logFile *os.File
}

// URL returns the cluster's connection string.
func (c *pgCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// unprivilegedUser returns the credential to run PostgreSQL with when this process is root,
// which PostgreSQL refuses: the postgres system user where it exists, else nobody.
func unprivilegedUser() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		return nil, "", nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, name, nil
	}
	return nil, "", errors.New("running as root, and PostgreSQL refuses root: create a postgres system user, or run outbox dev as another user")
}

// startPG initialises the cluster in dataDir if needed and starts it on port (0: the port
// of the last run if it is free, else any free port).
func startPG(ctx context.Context, binDir, dataDir string, port int, logPath string) (*pgCluster, error) {
	cred, userName, err := unprivilegedUser()
	if err != nil {
		return nil, err
	}
	c := &pgCluster{binDir: binDir, dataDir: dataDir, cred: cred}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dataDir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("give %s to user %s: %w", dataDir, userName, err)
		}
		if err := reachable(dataDir, cred); err != nil {
			return nil, fmt.Errorf("PostgreSQL runs as user %s here, which cannot reach %s (%v): choose a --dir whose parent folders others may enter, or chmod o+x them", userName, dataDir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		out, err := c.run(ctx, "initdb", "-D", dataDir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C")
		if err != nil {
			return nil, fmt.Errorf("initdb %s: %w\n%s", dataDir, err, out)
		}
	}
	portFile := filepath.Join(filepath.Dir(dataDir), "postgres.port")
	if port == 0 {
		if b, err := os.ReadFile(portFile); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && portFree(p) {
				port = p
			}
		}
	}
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	c.port = port
	_ = os.WriteFile(portFile, []byte(strconv.Itoa(port)+"\n"), 0o644)

	if c.logFile, err = os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, err
	}
	c.cmd = exec.Command(filepath.Join(binDir, "postgres"),
		"-D", dataDir,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=200",
	)
	c.cmd.Stdout, c.cmd.Stderr = c.logFile, c.logFile
	c.cmd.SysProcAttr = childAttr(cred)
	// The parent-death signal fires when the thread that started the child ends, so start
	// and wait for it on one locked thread that lives exactly as long as the child.
	c.exited = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer close(c.exited)
		if err := c.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = c.cmd.Wait()
	}()
	if err := <-started; err != nil {
		c.logFile.Close()
		return nil, fmt.Errorf("start postgres: %w", err)
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			conn.Close(ctx)
			return c, nil
		}
		select {
		case <-c.exited:
			c.logFile.Close()
			return nil, fmt.Errorf("postgres exited at start; its log %s ends with:\n%s", logPath, tail(logPath, 10))
		case <-ctx.Done():
			c.Stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("postgres did not accept connections within 60s; see %s", logPath)
		}
	}
}

// Stop shuts the cluster down (fast shutdown), killing it if it takes more than 30 seconds.
func (c *pgCluster) Stop() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	c.logFile.Close()
}

// Exited is closed when the postgres process has exited.
func (c *pgCluster) Exited() <-chan struct{} { return c.exited }

// PID returns the postmaster's process ID.
func (c *pgCluster) PID() int { return c.cmd.Process.Pid }

func (c *pgCluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, prog), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = os.TempDir() // a folder the unprivileged user may be in
	return cmd.CombinedOutput()
}

// reachable checks that every parent of dir can be entered by the credential's user.
func reachable(dir string, cred *syscall.Credential) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok {
			mode := fi.Mode().Perm()
			switch {
			case st.Uid == cred.Uid && mode&0o100 != 0:
			case st.Gid == cred.Gid && mode&0o010 != 0:
			case mode&0o001 != 0:
			default:
				return fmt.Errorf("%s has mode %s", d, mode)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
