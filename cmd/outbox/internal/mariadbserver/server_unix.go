//go:build unix

package mariadbserver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-go/outbox/internal/localserver"

	"github.com/outbox-go/outbox/store/mysqlstore"
)

// Server is a running private MariaDB or MySQL server.
type Server struct {
	progs   Programs
	user    string // the server's --user: the current user's name
	dataDir string
	port    int
	socket  string
	pidFile string
	proc    *localserver.Process
}

// URL returns the connection string of the server's outbox database, as root.
func (s *Server) URL() string {
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/%s", s.port, Database)
}

// DataDir returns the server's data folder.
func (s *Server) DataDir() string { return s.dataDir }

// Product returns MariaDB or MySQL.
func (s *Server) Product() string { return s.progs.Product }

// Start makes the data folder if needed, starts the server, waits until it accepts
// connections and creates the database [Database] (utf8mb4) if it is missing.
func Start(ctx context.Context, o Options) (*Server, error) {
	if !filepath.IsAbs(o.Dir) {
		return nil, fmt.Errorf("mariadbserver: Dir must be an absolute path, got %q", o.Dir)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.LogPath == "" {
		o.LogPath = filepath.Join(o.Dir, "mariadb.log")
	}
	s := &Server{progs: o.Programs, dataDir: filepath.Join(o.Dir, "mariadb"), socket: socketPath(o.Dir)}
	if s.progs.Server == "" {
		var err error
		if s.progs, err = FindPrograms(exec.LookPath); err != nil {
			return nil, err
		}
	}
	s.pidFile = filepath.Join(s.dataDir, "server.pid")
	s.user = userName(os.Geteuid(), func() (string, error) {
		u, err := user.Current()
		if err != nil {
			return "", err
		}
		return u.Username, nil
	})
	if err := s.prepare(ctx, o.Logger); err != nil {
		return nil, err
	}
	var err error
	if s.port, err = choosePort(filepath.Join(o.Dir, "mariadb.port"), o.Port); err != nil {
		return nil, err
	}
	if err := s.start(o.LogPath); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx, o.LogPath); err != nil {
		return nil, err
	}
	if err := s.createDatabase(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// prepare makes sure dataDir holds a whole data folder this server can open and that no
// server runs on: it makes one when there is none.
func (s *Server) prepare(ctx context.Context, logger *slog.Logger) error {
	state, err := inspectDataDir(s.dataDir, s.progs.Product)
	if err != nil {
		return err
	}
	if state == dataMissing {
		return s.initialise(ctx, logger)
	}
	if pid := s.running(); pid != 0 {
		return fmt.Errorf("a %s server (pid %d) is already running on %s: is another outbox dev using this folder? Stop it first", s.progs.Product, pid, s.dataDir)
	}
	return nil
}

// initialise makes a new data folder in a sibling folder and renames it to dataDir once
// the initialisation has finished, so dataDir never holds half a data folder.
func (s *Server) initialise(ctx context.Context, logger *slog.Logger) error {
	tmp := s.dataDir + ".init"
	if _, err := os.Stat(tmp); err == nil {
		logger.Warn("Making the MariaDB data folder again: its last initialisation did not finish", slog.String("folder", tmp))
	}
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.RemoveAll(s.dataDir); err != nil { // an empty folder
		return err
	}
	if err := os.MkdirAll(tmp, 0o750); err != nil {
		return err
	}
	started := time.Now()
	var cmd *exec.Cmd
	if s.progs.Product == MySQL {
		// --no-defaults must come first: no my.cnf of the machine's applies.
		cmd = exec.CommandContext(ctx, s.progs.Server, "--no-defaults", "--initialize-insecure", "--datadir="+tmp, "--user="+s.user)
	} else {
		cmd = exec.CommandContext(ctx, s.progs.InstallDB, "--no-defaults", "--datadir="+tmp,
			"--auth-root-authentication-method=normal", "--skip-test-db", "--user="+s.user,
			// Passed on to the server: a redo log of 16 MiB rather than 96, as at every start.
			"--innodb-log-file-size=16M")
	}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("make the %s data folder with %s: %w\n%s", s.progs.Product, strings.Join(cmd.Args, " "), err, localserver.LastLines(out, 20))
	}
	if err := os.Rename(tmp, s.dataDir); err != nil {
		return fmt.Errorf("move the new data folder to %s: %w", s.dataDir, err)
	}
	logger.Info("Made the "+s.progs.Product+" data folder", slog.String("folder", s.dataDir), slog.Duration("took", time.Since(started).Round(10*time.Millisecond)))
	return nil
}

// running returns the process ID of a server already running on dataDir, as its pid file
// names it, or 0.
func (s *Server) running() int {
	b, err := os.ReadFile(s.pidFile)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	// The pid file outlives a killed server, and the number may have been reused: where
	// the process's command line can be read, it must name this data folder.
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && !bytes.Contains(cmdline, []byte("--datadir="+s.dataDir+"\x00")) {
		return 0
	}
	return pid
}

// args returns the server's command line.
func (s *Server) args(logPath string) []string {
	args := []string{
		"--no-defaults", // first, or it is ignored
		"--datadir=" + s.dataDir,
		"--port=" + strconv.Itoa(s.port),
		"--bind-address=127.0.0.1",
		"--socket=" + s.socket,
		"--pid-file=" + s.pidFile,
		"--log-error=" + logPath,
		"--user=" + s.user,
		"--innodb-buffer-pool-size=64M",
	}
	if s.progs.Product == MySQL {
		// MySQL's X protocol would listen on 33060 (taken by a second server), and its
		// binary log, on by default, would fill the data folder.
		return append(args, "--mysqlx=OFF", "--skip-log-bin")
	}
	return append(args, "--innodb-log-file-size=16M")
}

// start starts the server.
func (s *Server) start(logPath string) error {
	cmd := exec.Command(s.progs.Server, s.args(logPath)...)
	cmd.Dir = "/"
	cmd.SysProcAttr = childAttr()
	var err error
	// SIGTERM: InnoDB writes its buffers and closes cleanly. What the server prints before
	// it opens its error log goes to the same file.
	s.proc, err = localserver.Start(cmd, logPath, syscall.SIGTERM)
	return err
}

// rootURL is the server's connection string on its system database, mysql, which every
// server has.
func (s *Server) rootURL() string {
	return fmt.Sprintf("mysql://root@127.0.0.1:%d/mysql?timeout=5s", s.port)
}

// waitReady waits until the server accepts connections.
func (s *Server) waitReady(ctx context.Context, logPath string) error {
	if _, err := mysqlstore.ParseURL(s.rootURL()); err != nil {
		s.Stop()
		return err
	}
	return s.proc.WaitReady(ctx, logPath, func(ctx context.Context) error {
		db, err := mysqlstore.Open(ctx, s.rootURL())
		if err == nil {
			_ = db.Close()
		}
		return err
	})
}

// createDatabase creates the database [Database] if it is missing.
func (s *Server) createDatabase(ctx context.Context) error {
	db, err := mysqlstore.Open(ctx, s.rootURL())
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+Database+"` CHARACTER SET utf8mb4 COLLATE "+mysqlstore.Collation); err != nil {
		return fmt.Errorf("create database %s: %w", Database, err)
	}
	return nil
}

// Stop shuts the server down (SIGTERM: InnoDB writes its buffers and closes cleanly),
// killing it if it takes more than 30 seconds. Calls after the first do nothing.
func (s *Server) Stop() {
	if s.proc != nil {
		s.proc.Stop()
	}
}

// Exited is closed when the server process has exited.
func (s *Server) Exited() <-chan struct{} { return s.proc.Exited() }

// PID returns the server's process ID.
func (s *Server) PID() int { return s.proc.PID() }
