// Package pgcluster runs a private PostgreSQL cluster for outbox dev: made with the local
// server programs in a folder of its own, started as a child process, stopped with it.
//
// A cluster is kept in Dir/postgres. When this process is root, PostgreSQL runs as the
// postgres system user (it refuses root); if that user cannot enter Dir, the data goes to
// /var/tmp/outbox-dev-<hash of Dir>/postgres instead, and [Cluster.DataDir] says so. A new
// cluster is made in a sibling folder and renamed into place once initdb has finished, so
// a half-made cluster is never started; one left by an older start is replaced, and a
// folder that holds something else is refused.
package pgcluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Options say where and how to run the cluster.
type Options struct {
	// BinDir holds initdb and postgres.
	BinDir string
	// Dir is the absolute folder the cluster belongs to; its data goes to Dir/postgres
	// unless PostgreSQL's user cannot enter Dir.
	Dir string
	// Port is the cluster's port; 0 takes the last run's port when it is free, else any
	// free port.
	Port int
	// LogPath receives PostgreSQL's log.
	LogPath string
	// Logger receives what was done to the cluster beyond starting it (an unfinished
	// one replaced).
	Logger *slog.Logger
}

// pgBinaries are the programs a private cluster needs.
var pgBinaries = []string{"initdb", "postgres"}

// FindBinDir returns the folder holding initdb and postgres: dir if given, else the one
// on PATH, else the newest of the usual install folders.
func FindBinDir(dir string, lookPath func(string) (string, error)) (string, error) {
	has := func(d string) bool {
		for _, b := range pgBinaries {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("PostgreSQL server programs (initdb, postgres) are not in %s, which --pg-bin-dir or OUTBOX_PG_BIN_DIR names.\n%s", dir, installHint)
	}
	if p, err := lookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	var candidates []string
	for _, pattern := range []string{
		"/usr/lib/postgresql/*/bin", // Debian, Ubuntu
		"/usr/pgsql-*/bin",          // RHEL, Fedora (PGDG)
		"/usr/local/pgsql/bin",      // built from source
		"/opt/homebrew/opt/postgresql*/bin",
		"/usr/local/opt/postgresql*/bin",
		"/Applications/Postgres.app/Contents/Versions/*/bin",
	} {
		m, _ := filepath.Glob(pattern)
		candidates = append(candidates, m...)
	}
	sort.Slice(candidates, func(i, j int) bool { return versionOf(candidates[i]) > versionOf(candidates[j]) })
	for _, d := range candidates {
		if has(d) {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server programs (initdb, postgres) found on PATH or in the usual folders.\n" + installHint)
}

const installHint = `Install them (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server;
macOS: brew install postgresql), or point --pg-bin-dir (or OUTBOX_PG_BIN_DIR) at the folder
that holds initdb and postgres, or set DATABASE_URL to use a database you already run`

// versionOf returns the major version in a path such as /usr/lib/postgresql/15/bin.
func versionOf(path string) int {
	for _, part := range strings.Split(path, string(filepath.Separator)) {
		digits := strings.TrimLeftFunc(part, func(r rune) bool { return r < '0' || r > '9' })
		if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			digits = digits[:i]
		}
		if v, err := strconv.Atoi(digits); err == nil {
			return v
		}
	}
	return 0
}
