package dev

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/workflows"
)

// The Temporal servers outbox dev can start (--temporal-server).
const (
	// ServerAuto is the Temporal CLI's development server when a temporal command is on
	// PATH (and the state is not asked to be in PostgreSQL), else the built-in server.
	ServerAuto = "auto"
	// ServerCLI is `temporal server start-dev`.
	ServerCLI = "cli"
	// ServerBuiltin is the Temporal server and Web UI the outbox builds from its own
	// module (cmd/outbox/internal/temporalserver) the first time it is needed.
	ServerBuiltin = "builtin"
)

// serverPackage is the main package of the built-in server.
const serverPackage = "github.com/outbox-go/outbox/cmd/outbox/internal/temporalserver"

// serverReadyWithin bounds how long a server may take to answer once started.
const serverReadyWithin = 2 * time.Minute

// Server is a Temporal server outbox dev runs as a child process.
type Server struct {
	Address string // the frontend's host:port
	UIURL   string // the Web UI, empty without one
	Kind    string // what runs it: "temporal CLI (path)" or "built-in server (path)"

	cmd       *exec.Cmd
	exited    chan struct{}
	logFile   string
	readyFile string // the built-in server writes it once it has started; empty for the CLI
}

// Exited is closed when the server's process has ended.
func (s *Server) Exited() <-chan struct{} { return s.exited }

// Stop ends the server: SIGTERM, then SIGKILL after 15 seconds.
func (s *Server) Stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// ResolveServer decides which server mode runs: mode is auto, cli or builtin; lookPath
// finds the temporal command (exec.LookPath in the binary).
func ResolveServer(mode string, o TemporalOptions, lookPath func(string) (string, error)) (string, error) {
	_, cliErr := lookPath("temporal")
	switch mode {
	case ServerAuto, "":
		if o.PostgresURL == "" && cliErr == nil {
			return ServerCLI, nil
		}
		return ServerBuiltin, nil
	case ServerCLI:
		if o.PostgresURL != "" {
			return "", fmt.Errorf("--temporal-server cli and %s: the Temporal CLI's server keeps its state in SQLite; use --temporal-server builtin", PostgresFlag)
		}
		if cliErr != nil {
			return "", fmt.Errorf("--temporal-server cli: no temporal command on PATH (%v); install the Temporal CLI (https://docs.temporal.io/cli) or use --temporal-server builtin", cliErr)
		}
		return ServerCLI, nil
	case ServerBuiltin:
		return ServerBuiltin, nil
	default:
		return "", cli.UsageErrorf("--temporal-server must be auto, cli or builtin, got %q", mode)
	}
}

// StartServer starts the Temporal server mode names (ServerCLI or ServerBuiltin, see
// ResolveServer) for o and returns once its frontend answers and its namespace exists.
// The server's output goes to o.LogFile.
func StartServer(ctx context.Context, mode string, o TemporalOptions, logger *slog.Logger) (*Server, error) {
	o.WithDefaults()
	var (
		name      string
		args      []string
		kind      string
		readyFile string
	)
	switch mode {
	case ServerCLI:
		path, err := exec.LookPath("temporal")
		if err != nil {
			return nil, fmt.Errorf("the Temporal CLI: %w", err)
		}
		name, args, kind = path, cliArgs(o), "temporal CLI ("+path+")"
	case ServerBuiltin:
		bin, err := buildServer(ctx, logger)
		if err != nil {
			return nil, err
		}
		ready, err := os.CreateTemp("", "outbox-temporal-ready-")
		if err != nil {
			return nil, err
		}
		ready.Close()
		readyFile = ready.Name()
		defer os.Remove(readyFile)
		if err := os.Remove(readyFile); err != nil {
			return nil, err
		}
		name, args, kind = bin, append(o.serverArgs(), "--ready-file", readyFile), "built-in server"
	default:
		return nil, fmt.Errorf("unknown Temporal server mode %q", mode)
	}
	for _, port := range []int{o.FrontendPort, o.UIPort, o.FrontendHTTPPort} {
		if port != 0 {
			if err := CheckPort(o.IP, port); err != nil {
				return nil, err
			}
		}
	}
	logOut := io.Discard
	if o.LogFile != "" {
		f, err := os.OpenFile(o.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open the log of the Temporal server: %w", err)
		}
		defer f.Close() // the child has its own descriptor
		logOut = f
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logOut, logOut
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", kind, err)
	}
	s := &Server{
		Address: net.JoinHostPort(o.IP, strconv.Itoa(o.FrontendPort)),
		Kind:    kind, cmd: cmd, exited: make(chan struct{}), logFile: o.LogFile, readyFile: readyFile,
	}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if o.UIPort != 0 {
		s.UIURL = "http://" + net.JoinHostPort(loopback(o.UIIP), strconv.Itoa(o.UIPort))
	}
	if err := s.waitReady(ctx, o); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// cliArgs is the command line of the Temporal CLI's development server for o, with the
// outbox's search attributes.
func cliArgs(o TemporalOptions) []string {
	args := []string{"server", "start-dev",
		"--ip", o.IP, "--port", strconv.Itoa(o.FrontendPort), "--namespace", o.Namespace,
		"--log-level", "warn"}
	if o.UIPort == 0 {
		args = append(args, "--headless")
	} else {
		args = append(args, "--ui-ip", o.UIIP, "--ui-port", strconv.Itoa(o.UIPort))
	}
	if o.FrontendHTTPPort != 0 {
		args = append(args, "--http-port", strconv.Itoa(o.FrontendHTTPPort))
	}
	if o.DatabaseFile != "" {
		args = append(args, "--db-filename", o.DatabaseFile)
	}
	for _, name := range workflows.SearchAttributeNames {
		args = append(args, "--search-attribute", name+"=Keyword")
	}
	return args
}

// waitReady waits until the frontend answers, the namespace exists and the UI listens.
func (s *Server) waitReady(ctx context.Context, o TemporalOptions) error {
	ctx, cancel := context.WithTimeout(ctx, serverReadyWithin)
	defer cancel()
	var last error
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("the %s exited before it answered; its log %s ends with:\n%s", s.Kind, s.logFile, logTail(s.logFile))
		case <-ctx.Done():
			return fmt.Errorf("the %s did not answer on %s within %s (%v); see its log %s", s.Kind, s.Address, serverReadyWithin, last, s.logFile)
		case <-time.After(100 * time.Millisecond):
		}
		if last = s.answers(ctx, o); last == nil {
			return nil
		}
	}
}

// answers checks once that the server has started (the built-in one says so through its
// ready file, once its namespace is usable everywhere), that the frontend answers and the
// namespace exists, and that the UI listens.
func (s *Server) answers(ctx context.Context, o TemporalOptions) error {
	if s.readyFile != "" {
		if _, err := os.Stat(s.readyFile); err != nil {
			return fmt.Errorf("not started yet")
		}
	}
	c, err := client.DialContext(ctx, client.Options{HostPort: s.Address, Namespace: o.Namespace, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: o.Namespace}); err != nil {
		return err
	}
	if s.UIURL != "" {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(s.UIURL, "http://"), time.Second)
		if err != nil {
			return err
		}
		conn.Close()
	}
	return nil
}

// buildServer builds the built-in server from the outbox module (go build skips the link
// when the binary is up to date) and returns its path: from the checkout this binary was
// built from when its sources are still there (a go run or go build without -trimpath
// records their paths), else from the working directory. The binary is kept in the user's
// cache, one per checkout, so later runs start in seconds.
func buildServer(ctx context.Context, logger *slog.Logger) (string, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the built-in Temporal server is built with the go command, which is not on PATH (%v); install the Temporal CLI or set TEMPORAL_ADDRESS to a running server", err)
	}
	wd, err := sourceDir()
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256([]byte(wd))
	dir := filepath.Join(cache, "outbox", "temporal-server-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("built-in Temporal server: %w", err)
	}
	unlock, err := lockFile(filepath.Join(dir, "build.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	bin := filepath.Join(dir, "outbox-temporal")
	if _, err := os.Stat(bin); err != nil {
		logger.Info("Building the built-in Temporal server (the first time takes a few minutes; with the Temporal CLI on PATH, outbox dev uses it instead)", "binary", bin)
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bin, serverPackage)
	cmd.Dir = wd
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the built-in Temporal server (go build %s in %s): %w\n%s\n"+
			"outbox dev builds it from a checkout of the outbox; elsewhere, install the Temporal CLI or set TEMPORAL_ADDRESS to a running server",
			serverPackage, wd, err, strings.TrimSpace(out.String()))
	}
	logger.Debug("Built-in Temporal server ready", "binary", bin, "took", time.Since(start).Round(time.Millisecond))
	return bin, nil
}

// sourceDir is the folder of this package's source when it is on disk (the binary was built
// from a checkout without -trimpath), else the working directory.
func sourceDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if _, err := os.Stat(file); err == nil {
			return filepath.Dir(file), nil
		}
	}
	return os.Getwd()
}

// lockFile takes an exclusive lock on path, so concurrent outbox dev processes build the
// server one at a time.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// CheckPort fails when ip:port cannot be bound.
func CheckPort(ip string, port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("cannot listen on %s:%d (is another outbox dev or Temporal server running?): %w", ip, port, err)
	}
	return l.Close()
}

// logTail returns the last lines of a log file.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}
