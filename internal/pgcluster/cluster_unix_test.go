//go:build unix

package pgcluster

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestInspectDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(t *testing.T, name string) {
		t.Helper()
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("15\n"), 0o644))
	}

	state, err := inspectDataDir(filepath.Join(dir, "absent"))
	require.NoError(t, err)
	require.Equal(t, dataMissing, state)

	state, err = inspectDataDir(dir)
	require.NoError(t, err)
	require.Equal(t, dataMissing, state, "an empty folder")

	write(t, "notes.txt")
	_, err = inspectDataDir(dir)
	require.ErrorContains(t, err, dir+" is not a PostgreSQL data folder (no PG_VERSION)")

	write(t, "PG_VERSION")
	state, err = inspectDataDir(dir)
	require.NoError(t, err)
	require.Equal(t, dataUnfinished, state)

	write(t, "postgresql.conf")
	write(t, "global/pg_control")
	state, err = inspectDataDir(dir)
	require.NoError(t, err)
	require.Equal(t, dataCluster, state)
}

// setup finds the local PostgreSQL server programs (skipping the test without them) and
// returns Options for a cluster in a new folder that only this user may enter, as a
// checkout in a home folder is.
func setup(t *testing.T) (Options, *bytes.Buffer) {
	t.Helper()
	binDir, err := FindBinDir(os.Getenv("OUTBOX_PG_BIN_DIR"), exec.LookPath)
	if err != nil {
		t.Skipf("no PostgreSQL server programs: %v", err)
	}
	base, err := os.MkdirTemp("", "pgcluster-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o700))
	dir := filepath.Join(base, ".outbox-dev")
	require.NoError(t, os.Mkdir(dir, 0o755))
	t.Cleanup(func() {
		_ = RemoveRelocated(dir)
		_ = os.RemoveAll(base)
	})
	var logs bytes.Buffer
	return Options{BinDir: binDir, Dir: dir, LogPath: filepath.Join(dir, "postgres.log"), Logger: slog.New(slog.NewTextHandler(&logs, nil))}, &logs
}

// query returns the data folder of the server at url.
func query(t *testing.T, url string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&v))
	return v
}

func TestStart(t *testing.T) {
	t.Parallel()

	t.Run("FreshFolderAndRestart", func(t *testing.T) {
		t.Parallel()
		o, _ := setup(t)
		c, err := Start(context.Background(), o)
		require.NoError(t, err)
		dataDir, moved := c.DataDir()
		require.Equal(t, dataDir, query(t, c.URL()))
		if os.Geteuid() == 0 {
			// PostgreSQL runs as another user, who cannot enter the private folder.
			require.NotEqual(t, filepath.Join(o.Dir, "postgres"), dataDir)
			require.Contains(t, moved, "cannot enter "+o.Dir)
		} else {
			require.Equal(t, filepath.Join(o.Dir, "postgres"), dataDir)
			require.Empty(t, moved)
		}
		require.NoDirExists(t, dataDir+".initdb")
		exec1(t, c.URL(), `CREATE TABLE kept (id int)`)
		c.Stop()

		// The next start finds the same cluster, with its data.
		c, err = Start(context.Background(), o)
		require.NoError(t, err)
		again, _ := c.DataDir()
		require.Equal(t, dataDir, again)
		exec1(t, c.URL(), `SELECT * FROM kept`)

		// A second start on a running cluster is refused with the reason.
		_, err = Start(context.Background(), o)
		require.ErrorContains(t, err, "is already running on "+dataDir)
		require.ErrorContains(t, err, "is another outbox dev using this folder?")
		c.Stop()

		require.NoError(t, RemoveRelocated(o.Dir))
		if moved != "" {
			require.NoDirExists(t, dataDir)
		}
	})

	t.Run("UnfinishedClusterIsReplaced", func(t *testing.T) {
		t.Parallel()
		o, logs := setup(t)
		dataDir, _, err := chooseDataDir(o.Dir, mustUser(t))
		require.NoError(t, err)
		// What a killed initdb leaves: the version file and some folders, no pg_control.
		require.NoError(t, os.MkdirAll(filepath.Join(dataDir, "base"), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "PG_VERSION"), []byte("15\n"), 0o600))
		c, err := Start(context.Background(), o)
		require.NoError(t, err)
		defer c.Stop()
		require.Contains(t, logs.String(), "initdb never finished")
		require.Contains(t, logs.String(), dataDir)
		require.Equal(t, dataDir, query(t, c.URL()))
	})

	t.Run("ForeignFolderIsRefused", func(t *testing.T) {
		t.Parallel()
		o, _ := setup(t)
		dataDir, _, err := chooseDataDir(o.Dir, mustUser(t))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(dataDir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "notes.txt"), []byte("mine"), 0o644))
		_, err = Start(context.Background(), o)
		require.ErrorContains(t, err, "is not a PostgreSQL data folder")
		require.FileExists(t, filepath.Join(dataDir, "notes.txt"), "nothing is wiped")
	})

	t.Run("OtherMajorVersionIsExplained", func(t *testing.T) {
		t.Parallel()
		o, _ := setup(t)
		if serverVersion(o.BinDir) == 0 {
			t.Skipf("%s/postgres --version does not tell its version", o.BinDir)
		}
		c, err := Start(context.Background(), o)
		require.NoError(t, err)
		dataDir, _ := c.DataDir()
		c.Stop()
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "PG_VERSION"), []byte("9\n"), 0o600))
		_, err = Start(context.Background(), o)
		require.ErrorContains(t, err, "was made by PostgreSQL 9")
		require.ErrorContains(t, err, "--reset")
	})

	t.Run("RelativeDirIsRefused", func(t *testing.T) {
		t.Parallel()
		_, err := Start(context.Background(), Options{Dir: ".outbox-dev"})
		require.ErrorContains(t, err, `Dir must be an absolute path, got ".outbox-dev"`)
	})
}

func mustUser(t *testing.T) pgUser {
	t.Helper()
	u, err := unprivilegedUser()
	require.NoError(t, err)
	return u
}

// exec1 runs one statement on its own connection.
func exec1(t *testing.T, url, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err)
}
