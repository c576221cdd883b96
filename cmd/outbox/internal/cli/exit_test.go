package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/internal/testdb"
)

// TestExitCodes runs commands that fail for each reason and checks the exit code the
// binary would end with: usage, config, an unreachable dependency, a failure.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unknownField := filepath.Join(dir, "typo.yaml")
	require.NoError(t, os.WriteFile(unknownField, []byte("relay:\n  poll_intervall: 1s\n"), 0o600))
	good := map[string]string{"DATABASE_URL": testdb.URL()}
	_, st := testdb.Schema(t)
	migrated := filepath.Join(dir, "migrated.yaml")
	require.NoError(t, os.WriteFile(migrated, []byte("schema: "+st.Schema()+"\n"), 0o600))
	refused := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/outbox?connect_timeout=2"}
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	u.Path = "/outbox_no_such_database"
	noDatabase := map[string]string{"DATABASE_URL": u.String()}
	// The same mistakes on MySQL (its test server, or one that is not there: the
	// subtests skip then).
	mysqlURL, _ := url.Parse(os.Getenv("TEST_MYSQL_URL"))
	mysqlWith := func(edit func(u *url.URL)) map[string]string {
		if mysqlURL == nil || mysqlURL.Host == "" {
			return nil
		}
		u := *mysqlURL
		edit(&u)
		return map[string]string{"DATABASE_URL": u.String()}
	}
	mysqlNoDatabase := mysqlWith(func(u *url.URL) { u.Path = "/outbox_no_such_database" })
	mysqlWrongPassword := mysqlWith(func(u *url.URL) { u.User = url.UserPassword(u.User.Username(), "wr0ng-pw") })

	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		msg  string
	}{
		{"UnknownCommand", nil, []string{"mirgate"}, cli.ExitUsage, `unknown command "mirgate"; did you mean migrate?`},
		{"UnknownSubcommand", nil, []string{"dlq", "redirve", "0191d6a2-0000-7000-8000-000000000000"}, cli.ExitUsage, `unknown command "redirve" for "outbox dlq"; did you mean redrive?`},
		{"UnknownTopicSubcommand", nil, []string{"topic", "puase", "order.created"}, cli.ExitUsage, `unknown command "puase" for "outbox topic"; did you mean pause?`},
		{"UnknownConfigSubcommand", nil, []string{"config", "chek"}, cli.ExitUsage, `unknown command "chek" for "outbox config"; did you mean check?`},
		{"UnknownSubcommandUnlikeAny", nil, []string{"retention", "purge"}, cli.ExitUsage, `unknown command "purge" for "outbox retention"; run outbox retention --help for the commands`},
		{"UnknownFlag", nil, []string{"migrate", "--forse"}, cli.ExitUsage, "unknown flag: --forse"},
		{"DemoFailRateOutOfRange", nil, []string{"demo", "--fail-rate", "2"}, cli.ExitUsage, "--fail-rate must be between 0 and 1, got 2"},
		{"DemoFailRateNaN", nil, []string{"demo", "--fail-rate", "NaN"}, cli.ExitUsage, "--fail-rate must be between 0 and 1, got NaN"},
		{"MissingArgument", nil, []string{"enqueue"}, cli.ExitUsage, "accepts 1 arg(s), received 0"},
		{"ExtraArgument", nil, []string{"migrate", "now"}, cli.ExitUsage, `unknown command "now" for "outbox migrate"`},
		{"BadFlagValue", nil, []string{"enqueue", "a", "--deliver-after", "soon"}, cli.ExitUsage, `invalid argument "soon" for "--deliver-after"`},
		{"FlagOutOfRange", nil, []string{"stats", "--log-format", "xml"}, cli.ExitUsage, `--log-format must be text or json, got "xml"`},
		{"NotAMessageID", nil, []string{"dlq", "show", "42"}, cli.ExitUsage, `message ID must be a UUID, got "42"`},
		{"PauseReasonTooLong", nil, []string{"topic", "pause", "order.created", "--reason", strings.Repeat("x", 1001)}, cli.ExitUsage, "--by or --reason: reason must be at most 1000 bytes"},
		{"MissingConfigFile", nil, []string{"migrate", "--config", filepath.Join(dir, "missing.yaml")}, cli.ExitConfig, "missing.yaml"},
		{"UnknownConfigField", nil, []string{"migrate", "--config", unknownField}, cli.ExitConfig, "field poll_intervall not found"},
		{"InvalidConfigValue", map[string]string{"DATABASE_URL": "mysql://x"}, []string{"migrate"}, cli.ExitConfig, "database_url"},
		{"NoSuchDatabase", noDatabase, []string{"stats"}, cli.ExitConfig, "outbox_no_such_database"},
		{"CodecKeyNotBase64", map[string]string{"OUTBOX_CODEC_KEY": "notbase64"}, []string{"codec-server", "--addr", "127.0.0.1:0"}, cli.ExitConfig, "OUTBOX_CODEC_KEY: key \"env\": not valid base64"},
		{"NoCodecConfigured", nil, []string{"codec-server", "--addr", "127.0.0.1:0"}, cli.ExitConfig, "no codec configured"},
		{"DatabaseDown", refused, []string{"stats"}, cli.ExitUnavailable, "connect to PostgreSQL at 127.0.0.1:1"},
		{"NoSuchMySQLDatabase", mysqlNoDatabase, []string{"stats"}, cli.ExitConfig, "Unknown database 'outbox_no_such_database'"},
		{"WrongMySQLPassword", mysqlWrongPassword, []string{"stats"}, cli.ExitConfig, "Access denied"},
		{"Failure", good, []string{"dlq", "show", "0191d6a2-0000-7000-8000-000000000000"}, cli.ExitFailure, "0191d6a2-0000-7000-8000-000000000000"},
		{"ShowWithTemporalDown", map[string]string{"DATABASE_URL": testdb.URL(), "TEMPORAL_ADDRESS": "127.0.0.1:1"},
			[]string{"show", "0191d6a2-0000-7000-8000-000000000000", "--config", migrated}, cli.ExitUnavailable, "its workflow history could not be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if strings.Contains(tc.name, "MySQL") && tc.env == nil {
				t.Skip("no MySQL server: TEST_MYSQL_URL is not set")
			}
			r := run(t, tc.env, "", tc.args...)
			require.Error(t, r.err, "outbox %s", strings.Join(tc.args, " "))
			require.ErrorContains(t, r.err, tc.msg)
			require.Equal(t, tc.code, cli.ExitCode(r.err), "outbox %s: %v", strings.Join(tc.args, " "), r.err)
		})
	}
	require.Equal(t, cli.ExitOK, cli.ExitCode(nil))
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := run(t, nil, "", "--version")
	require.NoError(t, r.err)
	require.Regexp(t, `^outbox \S+ .*go1\.\d+.* `+runtime.GOOS+"/"+runtime.GOARCH+"\n$", r.stdout)

	r = run(t, nil, "", "version")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, "version  ")
	require.Contains(t, r.stdout, "go       "+runtime.Version())

	r = run(t, nil, "", "version", "--json")
	require.NoError(t, r.err)
	var b cli.BuildInfo
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &b), r.stdout)
	require.Equal(t, runtime.Version(), b.GoVersion)
	require.NotEmpty(t, b.Version)
	require.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, b.Platform)
}

// A worker, relay or run stopped while it still connects exits 0, as when it is stopped
// later; a one-shot command stopped so fails.
func TestStoppedWhileConnecting(t *testing.T) {
	t.Parallel()
	// A database that accepts the connection and never answers: the stop comes first.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	held := make(chan net.Conn, 16)
	t.Cleanup(func() {
		_ = l.Close()
		for {
			select {
			case c := <-held:
				_ = c.Close()
			default:
				return
			}
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	env := map[string]string{"DATABASE_URL": "postgres://postgres@" + l.Addr().String() + "/outbox?sslmode=disable&connect_timeout=30"}
	for _, args := range [][]string{{"worker"}, {"relay"}, {"run"}, {"stats"}} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			root := cli.NewRoot(strings.NewReader(""), &stdout, &stderr, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			root.SetArgs(args)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			err := root.ExecuteContext(ctx)
			if args[0] == "stats" {
				require.Error(t, err)
				return
			}
			require.NoError(t, err, "outbox %s stopped while connecting", args[0])
		})
	}
}
