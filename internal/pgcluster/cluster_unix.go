//go:build unix

package pgcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/outbox-go/outbox/internal/localserver"

	"github.com/jackc/pgx/v5"
)

// Cluster is a running private PostgreSQL cluster.
type Cluster struct {
	binDir  string
	dataDir string
	moved   string // why dataDir is not under Options.Dir; empty when it is
	port    int
	cred    *syscall.Credential // nil: run as the current user
	proc    *localserver.Process
}

// URL returns the cluster's connection string.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// DataDir returns the cluster's data folder, and why it is not under Options.Dir (empty
// when it is).
func (c *Cluster) DataDir() (string, string) { return c.dataDir, c.moved }

// pgUser is the user PostgreSQL runs as.
type pgUser struct {
	name string
	cred *syscall.Credential // nil: the current user
}

func (u pgUser) uid() int {
	if u.cred == nil {
		return os.Geteuid()
	}
	return int(u.cred.Uid)
}

// unprivilegedUser returns the user to run PostgreSQL as: the current one, unless this
// process is root, which PostgreSQL refuses; then the postgres system user where it
// exists, else nobody.
func unprivilegedUser() (pgUser, error) {
	if os.Geteuid() != 0 {
		name := strconv.Itoa(os.Geteuid())
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return pgUser{name: name}, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return pgUser{name: name, cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
	}
	return pgUser{}, errors.New("running as root, and PostgreSQL refuses root: create a postgres system user, or run outbox dev as another user")
}

// Start makes the cluster if needed and starts it. Its data goes to Dir/postgres, or to
// the folder relocatedDir names when PostgreSQL's user cannot enter Dir.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if !filepath.IsAbs(o.Dir) {
		return nil, fmt.Errorf("pgcluster: Dir must be an absolute path, got %q", o.Dir)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	u, err := unprivilegedUser()
	if err != nil {
		return nil, err
	}
	c := &Cluster{binDir: o.BinDir, cred: u.cred}
	if c.dataDir, c.moved, err = chooseDataDir(o.Dir, u); err != nil {
		return nil, err
	}
	if err := c.prepare(ctx, u, o.Logger); err != nil {
		return nil, err
	}
	if c.port, err = localserver.ChoosePort(filepath.Join(o.Dir, "postgres.port"), o.Port); err != nil {
		return nil, err
	}
	if err := c.start(o.LogPath); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, o.LogPath); err != nil {
		return nil, err
	}
	return c, nil
}

// chooseDataDir returns devDir/postgres when PostgreSQL's user can enter devDir, else a
// folder of its own under /var/tmp (kept across reboots, unlike /tmp) named after devDir,
// so that the next start from the same folder finds the same cluster.
func chooseDataDir(devDir string, u pgUser) (dataDir, moved string, err error) {
	local := filepath.Join(devDir, "postgres")
	if u.cred == nil {
		return local, "", nil
	}
	blocked := reachable(local, u.cred)
	if blocked == nil {
		return local, "", nil
	}
	base, err := relocatedDir(devDir)
	if err != nil {
		return "", "", fmt.Errorf("PostgreSQL runs as user %s here, which cannot reach %s (%v), and no folder it can reach is available: %w", u.name, devDir, blocked, err)
	}
	if err := reachable(filepath.Join(base, "postgres"), u.cred); err != nil {
		return "", "", fmt.Errorf("PostgreSQL runs as user %s here, which cannot reach %s (%v) nor %s (%v): choose a --dir whose parent folders others may enter", u.name, devDir, blocked, base, err)
	}
	why := fmt.Sprintf("PostgreSQL runs as user %s, which cannot enter %s (%v)", u.name, devDir, blocked)
	return filepath.Join(base, "postgres"), why, nil
}

// relocatedDir returns (creating it) the folder that holds the cluster of devDir when
// PostgreSQL's user cannot enter devDir: /var/tmp/outbox-dev-<hash of devDir>, owned by
// this process's user and writable by it alone.
func relocatedDir(devDir string) (string, error) {
	dir := relocatedPath(devDir)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// The parent is world-writable: refuse a folder someone else made or a link.
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("%s exists but is not a folder owned by this user and writable by it alone; remove it", dir)
	}
	return dir, nil
}

// relocatedPath is where relocatedDir keeps the cluster of devDir.
func relocatedPath(devDir string) string {
	base := "/var/tmp"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	sum := sha256.Sum256([]byte(devDir))
	return filepath.Join(base, "outbox-dev-"+hex.EncodeToString(sum[:8]))
}

// prepare makes sure dataDir holds a whole cluster that this PostgreSQL can run: it makes
// one when there is none, and explains (or, for a cluster whose initdb never finished,
// replaces) what it cannot use.
func (c *Cluster) prepare(ctx context.Context, u pgUser, logger *slog.Logger) error {
	state, err := inspectDataDir(c.dataDir)
	if err != nil {
		return err
	}
	switch state {
	case dataMissing:
		return c.initdb(ctx, u)
	case dataUnfinished:
		// initdb never finished here (it was killed): nothing in it can be a user's data.
		logger.Warn("Replacing a PostgreSQL cluster whose initdb never finished (it has no global/pg_control)", slog.String("data_dir", c.dataDir))
		if err := os.RemoveAll(c.dataDir); err != nil {
			return fmt.Errorf("remove the unfinished cluster in %s: %w", c.dataDir, err)
		}
		return c.initdb(ctx, u)
	}
	return c.checkCluster(u)
}

type dataState int

const (
	dataMissing    dataState = iota // no folder, or an empty one
	dataUnfinished                  // initdb started but did not finish
	dataCluster                     // a whole cluster
)

// inspectDataDir tells what dataDir holds. A folder with files that is not a cluster at
// all is an error: it is never wiped or reused.
func inspectDataDir(dataDir string) (dataState, error) {
	entries, err := os.ReadDir(dataDir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return dataMissing, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the PostgreSQL data folder %s: %w", dataDir, err)
	}
	exists := func(name string) bool { _, err := os.Stat(filepath.Join(dataDir, name)); return err == nil }
	switch {
	case exists("global/pg_control") && exists("PG_VERSION") && exists("postgresql.conf"):
		return dataCluster, nil
	case exists("PG_VERSION") || exists("postgresql.conf") || exists("base"):
		return dataUnfinished, nil
	}
	return 0, fmt.Errorf("%s is not a PostgreSQL data folder (no PG_VERSION), and outbox dev keeps its cluster there: move what it holds elsewhere, or choose another --dir", dataDir)
}

// initdb makes a new cluster in a sibling folder and renames it to dataDir once initdb
// has finished, so dataDir never holds half a cluster.
func (c *Cluster) initdb(ctx context.Context, u pgUser) error {
	tmp := c.dataDir + ".initdb"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.RemoveAll(c.dataDir); err != nil { // an empty folder
		return err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	if u.cred != nil {
		if err := os.Chown(tmp, int(u.cred.Uid), int(u.cred.Gid)); err != nil {
			return fmt.Errorf("give %s to user %s: %w", tmp, u.name, err)
		}
	}
	out, err := c.run(ctx, "initdb", "-D", tmp, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C")
	if err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("initdb %s: %w\n%s", tmp, err, out)
	}
	if err := os.Rename(tmp, c.dataDir); err != nil {
		return fmt.Errorf("move the new cluster to %s: %w", c.dataDir, err)
	}
	return nil
}

// checkCluster explains what would make postgres refuse an existing cluster: another
// user's files, another major version, a postgres still running on it.
func (c *Cluster) checkCluster(u pgUser) error {
	fi, err := os.Stat(c.dataDir)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != u.uid() {
		owner := strconv.Itoa(int(st.Uid))
		if o, err := user.LookupId(owner); err == nil {
			owner = o.Username
		}
		return fmt.Errorf("the PostgreSQL cluster in %s belongs to user %s, but PostgreSQL would run as user %s here: run outbox dev as the user who made it, or wipe it with --reset", c.dataDir, owner, u.name)
	}
	if b, err := os.ReadFile(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		have := strings.TrimSpace(string(b))
		if want := serverVersion(c.binDir); want != 0 && have != strconv.Itoa(want) {
			return fmt.Errorf("the PostgreSQL cluster in %s was made by PostgreSQL %s, and the server programs in %s are version %d: use --pg-bin-dir to pick version %s, or wipe the cluster with --reset", c.dataDir, have, c.binDir, want, have)
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid")); err == nil {
		pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
		if pid > 0 && syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("a PostgreSQL server (pid %d) is already running on %s: is another outbox dev using this folder? Stop it first", pid, c.dataDir)
		}
	}
	return nil
}

// serverVersion returns the major version of binDir/postgres (0 when it cannot tell).
func serverVersion(binDir string) int {
	out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return 0
	}
	// "postgres (PostgreSQL) 15.19 (Debian 15.19-0+deb12u1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return 0
	}
	major, _ := strconv.Atoi(strings.SplitN(fields[2], ".", 2)[0])
	return major
}

// start starts postgres.
func (c *Cluster) start(logPath string) error {
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"),
		"-D", c.dataDir,
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=200",
	)
	cmd.Dir = "/" // a folder every user may be in
	cmd.SysProcAttr = childAttr(c.cred)
	var err error
	c.proc, err = localserver.Start(cmd, logPath, syscall.SIGINT) // SIGINT: fast shutdown
	return err
}

// waitReady waits until the cluster accepts connections.
func (c *Cluster) waitReady(ctx context.Context, logPath string) error {
	return c.proc.WaitReady(ctx, logPath, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			conn.Close(ctx)
		}
		return err
	})
}

// Stop shuts the cluster down (fast shutdown), killing it if it takes more than 30 seconds.
func (c *Cluster) Stop() {
	if c.proc != nil {
		c.proc.Stop()
	}
}

// Exited is closed when the postgres process has exited.
func (c *Cluster) Exited() <-chan struct{} { return c.proc.Exited() }

// PID returns the postmaster's process ID.
func (c *Cluster) PID() int { return c.proc.PID() }

func (c *Cluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, prog), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = "/" // a folder every user may be in
	return cmd.CombinedOutput()
}

// RemoveRelocated wipes the cluster that Start keeps outside devDir for devDir, if there
// is one.
func RemoveRelocated(devDir string) error {
	dir := relocatedPath(devDir)
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is not a folder of this user's; remove it yourself", dir)
	}
	return os.RemoveAll(dir)
}

// reachable checks that every parent of dir can be entered by the credential's user.
func reachable(dir string, cred *syscall.Credential) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			// As the kernel decides: the owner's bits for the owner, the group's for
			// the group, the others' for everyone else.
			mode, bit := fi.Mode().Perm(), os.FileMode(0o001)
			switch {
			case st.Uid == cred.Uid:
				bit = 0o100
			case st.Gid == cred.Gid:
				bit = 0o010
			}
			if mode&bit == 0 {
				return fmt.Errorf("%s has mode %s", d, mode)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
