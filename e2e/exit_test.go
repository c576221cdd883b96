package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/server/temporaltest"

	"github.com/outbox-go/outbox/internal/testdb"
)

// TestBinaryExitCodes runs the outbox binary as a script would and checks the exit code of
// each kind of failure: a Temporal namespace that does not exist is a config error naming
// the namespace (not a request to create search attributes), a Temporal server that does not
// answer is unavailable, an unknown command is a usage error.
func TestBinaryExitCodes(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	ts := temporaltest.NewServer(temporaltest.WithT(t))
	_, st := testdb.Schema(t)
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf("schema: %s\ntemporal:\n  task_queue: exit-%s\n", st.Schema(), st.Schema())), 0o600))

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int // the exit codes of cmd/outbox/internal/cli/exit.go: 64 usage, 69 unavailable, 78 config
		want string
	}{
		{"MissingNamespace", []string{"TEMPORAL_ADDRESS=" + ts.GetFrontendHostPort(), "TEMPORAL_NAMESPACE=no-such-namespace"},
			[]string{"relay", "--config", cfgPath}, 78 /* config */, `namespace "no-such-namespace" not found`},
		{"TemporalDown", []string{"TEMPORAL_ADDRESS=127.0.0.1:1"}, []string{"relay", "--config", cfgPath}, 69 /* unavailable */, "connect to Temporal at 127.0.0.1:1"},
		{"UnknownCommand", nil, []string{"wokrer"}, 64 /* usage */, `did you mean worker?`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Env = append(os.Environ(), append(tc.env, "DATABASE_URL="+testdb.URL())...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "outbox %v: %v\n%s", tc.args, err, out)
			require.Equal(t, tc.code, exit.ExitCode(), "%s", out)
			require.Contains(t, string(out), tc.want)
			require.NotContains(t, string(out), "search-attribute create")
		})
	}
}
