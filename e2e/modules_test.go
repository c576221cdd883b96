package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLibraryWithoutTemporalServer builds a team's worker module that imports the outbox
// packages a worker needs (app, config, delivery and outboxtest included), as a consumer
// does (its own go.mod, no workspace), and checks that its module graph holds neither the
// Temporal server nor the UI server; that the command links neither (outbox dev runs a
// server in a child process); and that the production build of the command (-tags nodev)
// leaves dev out.
func TestLibraryWithoutTemporalServer(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)

	t.Run("Consumer", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(`module example.com/team

go 1.26.0

require github.com/outbox-go/outbox v0.0.0-00010101000000-000000000000

`+sharedReplaces(root)+`replace github.com/outbox-go/outbox => `+root+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(`package main

import (
	_ "github.com/outbox-go/outbox/app"
	_ "github.com/outbox-go/outbox/config"
	_ "github.com/outbox-go/outbox/delivery"
	_ "github.com/outbox-go/outbox/outboxtest"
	_ "github.com/outbox-go/outbox/store"
	_ "github.com/outbox-go/outbox/worker"
	_ "github.com/outbox-go/outbox/workflows"
)

func main() {}
`), 0o644))
		// The library's checksums cover the consumer's graph.
		sums, err := os.ReadFile(filepath.Join(root, "go.sum"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644))

		goCmd(t, dir, "mod", "tidy")
		mods := goCmd(t, dir, "list", "-m", "all")
		require.NotContains(t, mods, "go.temporal.io/server")
		require.NotContains(t, mods, "github.com/temporalio/ui-server")
		require.Contains(t, mods, "go.temporal.io/sdk ")
		require.NotContains(t, mods, "github.com/go-sql-driver/mysql", "a team on PostgreSQL downloads no MySQL driver")
		goCmd(t, dir, "build", "-o", filepath.Join(dir, "team-worker"), ".")
	})

	// A team on MySQL requires the mysqlstore module alone: the PostgreSQL driver and the
	// library module (which requires it) stay out of its module graph, and it builds with
	// the go.sum of the modules it requires.
	t.Run("MySQLConsumer", func(t *testing.T) {
		dir := t.TempDir()
		mysqlstore := filepath.Join(root, "store", "mysqlstore")
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(`module example.com/team

go 1.26.0

require github.com/outbox-go/outbox/store/mysqlstore v0.0.0-00010101000000-000000000000

`+sharedReplaces(root)+`replace github.com/outbox-go/outbox/store/mysqlstore => `+mysqlstore+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(`package main

import (
	"context"
	"encoding/json"

	"github.com/outbox-go/outbox/store/mysqlstore"
)

func main() {
	ctx := context.Background()
	db, err := mysqlstore.Open(ctx, "mysql://app@127.0.0.1:3306/app")
	if err != nil {
		panic(err)
	}
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	if _, err := st.Enqueue(ctx, tx, mysqlstore.Message{Topic: "order.created", Payload: json.RawMessage(`+"`{}`"+`)}); err != nil {
		panic(err)
	}
	_ = tx.Commit()
}
`), 0o644))
		var sums []byte
		for _, d := range []string{mysqlstore, filepath.Join(root, "store", "storedriver")} {
			b, err := os.ReadFile(filepath.Join(d, "go.sum"))
			require.NoError(t, err)
			sums = append(sums, b...)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644))
		goCmd(t, dir, "mod", "tidy")
		mods := goCmd(t, dir, "list", "-m", "all")
		require.Contains(t, mods, "github.com/go-sql-driver/mysql ")
		require.NotContains(t, mods, "github.com/jackc/pgx", "a team on MySQL downloads no PostgreSQL driver")
		require.NotContains(t, mods, "github.com/outbox-go/outbox ", "nor the library module")
		require.NotContains(t, mods, "go.temporal.io/")
		goCmd(t, dir, "build", "-o", filepath.Join(dir, "team-app"), ".")
	})

	t.Run("DeliveryNeedsOnlyTheStandardLibrary", func(t *testing.T) {
		deps := goCmd(t, root, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./delivery")
		require.Equal(t, "github.com/outbox-go/outbox/delivery", strings.TrimSpace(deps))
	})

	// go run ./cmd/outbox dev builds only the outbox: the Temporal server it may need is
	// the Temporal CLI's, or the temporalserver binary it builds on first use.
	t.Run("CommandWithoutServer", func(t *testing.T) {
		deps := goCmd(t, filepath.Join(root, "cmd", "outbox"), "list", "-deps", ".")
		require.NotContains(t, deps, "go.temporal.io/server")
		require.NotContains(t, deps, "github.com/temporalio/ui-server")
		require.Contains(t, goCmd(t, filepath.Join(root, "cmd", "outbox"), "list", "-deps", "./internal/temporalserver"), "go.temporal.io/server/temporal\n")
	})

	t.Run("ProductionBinary", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "outbox")
		goCmd(t, filepath.Join(root, "cmd", "outbox"), "build", "-tags", "nodev", "-o", bin, ".")
		deps := goCmd(t, root, "version", "-m", bin)
		require.NotContains(t, deps, "go.temporal.io/server")
		require.NotContains(t, deps, "github.com/temporalio/ui-server")
		out, err := exec.Command(bin, "--help").CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "worker")
		require.NotContains(t, string(out), "\n  dev ")
	})
}

// TestLibraryWithoutCommand checks that the layers read top to bottom: the command's
// packages (its cobra tree, outbox dev and bench, the demo services) live under
// cmd/outbox/internal/, the leaf helpers they share with the library under internal/, and
// no package of the root module depends on a command package. The root module's packages
// are listed outside the workspace, as a consumer builds them: the library, its internal
// helpers, the chaos suite and the examples. The examples are programs, not packages a
// team imports, but they are what a team copies: they must build from the library alone,
// so they are checked too. Test files are left out: their imports are not the library's.
func TestLibraryWithoutCommand(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)

	for path, want := range map[string]bool{
		"github.com/outbox-go/outbox/cmd/outbox": true, "github.com/outbox-go/outbox/cmd/outbox/internal/cli": true,
		"github.com/outbox-go/outbox/internal/cli": true, "github.com/outbox-go/outbox/internal/demo": true,
		"github.com/outbox-go/outbox/internal/redact": false, "github.com/outbox-go/outbox/internal/client": false,
		"github.com/spf13/cobra": false,
	} {
		require.Equal(t, want, isCommandPackage(path), path)
	}

	pkgs := strings.Fields(goCmd(t, root, "list", "./..."))
	require.Contains(t, pkgs, "github.com/outbox-go/outbox/store")
	require.Contains(t, pkgs, "github.com/outbox-go/outbox/internal/pgcluster")
	for _, p := range pkgs {
		require.False(t, strings.HasPrefix(p, "github.com/outbox-go/outbox/cmd/"), "%s: the root module holds a package of the command's module", p)
	}
	// -e lists a dependency that does not resolve (a command package outside the root
	// module) instead of stopping at it, so the failure names it.
	deps := strings.Fields(goCmd(t, root, "list", "-e", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./..."))
	require.Contains(t, deps, "github.com/outbox-go/outbox/workflows")
	var command []string
	for _, d := range deps {
		if isCommandPackage(d) {
			command = append(command, d)
		}
	}
	require.Empty(t, command, "packages of the root module depend on command packages; run go list -deps ./... in %s", root)
}

// isCommandPackage reports whether the package at path belongs to the outbox command: it
// lives under cmd/, or it is a cli or demo package wherever it is (the cobra tree and the
// demo services of outbox dev lived in internal/ before they moved to cmd/outbox/internal/).
func isCommandPackage(path string) bool {
	const module = "github.com/outbox-go/outbox/"
	rest, ok := strings.CutPrefix(path, module)
	if !ok {
		return false
	}
	if strings.HasPrefix(rest, "cmd/") {
		return true
	}
	for _, name := range []string{"cli", "demo"} {
		if strings.HasSuffix(rest, "internal/"+name) || strings.Contains(rest, "internal/"+name+"/") {
			return true
		}
	}
	return false
}

// goCmd runs the go command in dir outside any workspace, as a module on its own, and
// returns its standard output (what it says on standard error, such as the modules it
// downloads on a machine whose module cache lacks them, is shown only when it fails). It
// never changes a go.mod or go.sum of the repository: only go mod tidy writes them, and
// only in the consumer's folder.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s: %s%s", strings.Join(args, " "), out, stderr.Bytes())
	return string(out)
}

// TestSinksDependOnTheContractOnly: each sink depends on the handler contract (delivery),
// what the sinks share (sinks) and helpers, never on a part above it (activities,
// workflows, config, store, app, ...), so a sink can be read, tested and copied alone.
func TestSinksDependOnTheContractOnly(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	const module = "github.com/outbox-go/outbox/"
	allowed := func(dep string) bool {
		rest := strings.TrimPrefix(dep, module)
		return rest == "delivery" || rest == "sinks" || rest == "webhook" || strings.HasPrefix(rest, "internal/")
	}
	sinks := strings.Fields(goCmd(t, root, "list", "./sinks/..."))
	require.Contains(t, sinks, module+"sinks/httpsink")
	for _, sink := range sinks {
		for _, dep := range strings.Fields(goCmd(t, root, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", sink)) {
			if dep == sink || !strings.HasPrefix(dep, module) {
				continue
			}
			require.True(t, allowed(dep), "%s depends on %s, a part above the sinks", sink, dep)
		}
	}
}

// sharedReplaces are the replace directives a consumer's go.mod needs for the modules the
// library and the MySQL store require from this repository (the store driver, the URL
// redactor and the trace helpers): published versions would need none.
func sharedReplaces(root string) string {
	var b strings.Builder
	for _, dir := range []string{"store/storedriver", "internal/redact", "internal/tracing"} {
		fmt.Fprintf(&b, "replace github.com/outbox-go/outbox/%s => %s\n\n", dir, filepath.Join(root, filepath.FromSlash(dir)))
	}
	return b.String()
}
