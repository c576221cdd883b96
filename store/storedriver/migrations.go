package storedriver

import (
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
)

var migrationName = regexp.MustCompile(`^(\d{4})_[a-z0-9_]+\.up\.sql$`)

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	// SQL is the file's text, with its placeholders ({{schema}}, and {{channel}} on
	// PostgreSQL) still in place.
	SQL string
}

// ReadMigrations reads the migrations of folder dir of fsys, files named
// NNNN_name.up.sql, in version order: the form of every store's migrations.
func ReadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q does not match NNNN_name.up.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
