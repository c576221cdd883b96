//go:build unix

package mariadbserver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-go/outbox/internal/localserver"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/mysqlstore"
)

// TestFindPrograms checks which programs are chosen from folders holding fake ones.
func TestFindPrograms(t *testing.T) {
	notOnPath := func(name string) (string, error) { return "", errors.New(name + ": not found") }
	program := func(dir, name string) {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755))
	}
	for _, tc := range []struct {
		name     string
		files    map[string][]string // folder (sbin or bin) → programs
		version  string
		want     Programs // paths relative to the test's folder
		wantErrs []string
	}{
		{name: "MariaDB", files: map[string][]string{"sbin": {"mariadbd", "mysqld"}, "bin": {"mariadb-install-db"}},
			want: Programs{Server: "sbin/mariadbd", InstallDB: "bin/mariadb-install-db", Product: MariaDB}},
		{name: "MariaDBOldNames", files: map[string][]string{"sbin": {"mysqld"}, "bin": {"mysql_install_db"}},
			version: "mysqld  Ver 10.5.23-MariaDB for Linux", want: Programs{Server: "sbin/mysqld", InstallDB: "bin/mysql_install_db", Product: MariaDB}},
		{name: "MySQL", files: map[string][]string{"bin": {"mysqld"}},
			version: "mysqld  Ver 8.0.36 for Linux on x86_64 (MySQL Community Server - GPL)", want: Programs{Server: "bin/mysqld", Product: MySQL}},
		{name: "NoInstallDB", files: map[string][]string{"sbin": {"mariadbd"}},
			wantErrs: []string{"found the MariaDB server", "mariadb-install-db", "apt-get install mariadb-server"}},
		{name: "Nothing", wantErrs: []string{"no MariaDB or MySQL server program (mariadbd or mysqld) found", "apt-get install mariadb-server", "DATABASE_URL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			for dir, names := range tc.files {
				for _, name := range names {
					program(filepath.Join(base, dir), name)
				}
			}
			got, err := findPrograms(notOnPath, []string{filepath.Join(base, "sbin"), filepath.Join(base, "bin")}, func(string) string { return tc.version })
			if tc.wantErrs != nil {
				require.Error(t, err)
				for _, want := range tc.wantErrs {
					require.Contains(t, err.Error(), want)
				}
				return
			}
			require.NoError(t, err)
			tc.want.Server = filepath.Join(base, tc.want.Server)
			if tc.want.InstallDB != "" {
				tc.want.InstallDB = filepath.Join(base, tc.want.InstallDB)
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestSocketPath(t *testing.T) {
	require.Equal(t, "/home/dev/app/.outbox-dev/mariadb.sock", socketPath("/home/dev/app/.outbox-dev"))
	long := "/home/dev/" + strings.Repeat("a-rather-long-folder-name/", 5) + ".outbox-dev"
	p := socketPath(long)
	require.LessOrEqual(t, len(p), maxSocketPath)
	require.True(t, strings.HasPrefix(filepath.Base(p), "outbox-mariadb-"), p)
	require.Equal(t, p, socketPath(long), "the same folder, the same socket")
	require.NotEqual(t, p, socketPath(long+"2"))
}

func TestInspectDataDir(t *testing.T) {
	dir := t.TempDir()
	state, err := inspectDataDir(filepath.Join(dir, "missing"), MariaDB)
	require.NoError(t, err)
	require.Equal(t, dataMissing, state)

	other := filepath.Join(dir, "other")
	require.NoError(t, os.MkdirAll(other, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(other, "notes.txt"), nil, 0o644))
	_, err = inspectDataDir(other, MariaDB)
	require.ErrorContains(t, err, "is not a MariaDB or MySQL data folder")

	mysql := filepath.Join(dir, "mysql8")
	require.NoError(t, os.MkdirAll(filepath.Join(mysql, "mysql"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(mysql, "mysql.ibd"), nil, 0o644))
	_, err = inspectDataDir(mysql, MariaDB)
	require.ErrorContains(t, err, "was made by MySQL, and the server installed here is MariaDB")
	state, err = inspectDataDir(mysql, MySQL)
	require.NoError(t, err)
	require.Equal(t, dataServer, state)
}

// TestStart makes, starts, stops and starts again a private server with the programs
// installed here: the second start keeps the data and the port, a start on a folder whose
// server runs is refused, and an interrupted initialisation is made again.
func TestStart(t *testing.T) {
	progs, err := FindPrograms(exec.LookPath)
	if err != nil {
		t.Skipf("no MariaDB or MySQL server installed: %v", err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	// As an initialisation killed halfway leaves it.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "mariadb.init", "mysql"), 0o755))

	start := func() *Server {
		t.Helper()
		s, err := Start(ctx, Options{Dir: dir, Programs: progs})
		require.NoError(t, err, "log:\n%s", localserver.Tail(filepath.Join(dir, "mariadb.log"), 20))
		t.Cleanup(s.Stop)
		return s
	}
	s := start()
	require.True(t, strings.HasPrefix(s.URL(), "mysql://root@127.0.0.1:"), s.URL())
	require.True(t, strings.HasSuffix(s.URL(), "/outbox"), s.URL())
	require.NoDirExists(t, filepath.Join(dir, "mariadb.init"))
	db, err := mysqlstore.Open(ctx, s.URL())
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "CREATE TABLE kept (id INT PRIMARY KEY)")
	require.NoError(t, err)
	var charset string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT @@character_set_database").Scan(&charset))
	require.Equal(t, "utf8mb4", charset)
	require.NoError(t, db.Close())

	_, err = Start(ctx, Options{Dir: dir, Programs: progs})
	require.ErrorContains(t, err, "is already running on "+s.DataDir())

	pid, url := s.PID(), s.URL()
	s.Stop()
	select {
	case <-s.Exited():
	default:
		t.Fatal("Stop returned before the server exited")
	}
	require.Error(t, syscall.Kill(pid, 0), "the server is gone")
	_, err = os.Stat(socketPath(dir))
	require.ErrorIs(t, err, os.ErrNotExist, "the server removed its socket")

	started := time.Now()
	s = start()
	t.Logf("second start took %s", time.Since(started))
	require.Equal(t, url, s.URL(), "the last run's port")
	db, err = mysqlstore.Open(ctx, s.URL())
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM kept").Scan(&n))
	s.Stop()
}
