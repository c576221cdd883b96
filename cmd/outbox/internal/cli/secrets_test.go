package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/internal/testdb"
)

// The secrets below must never appear in any output or error of any command.
const (
	dbPassword     = "PgPassw0rdLeakCanary"
	apiKey         = "ApiKeyLeakCanary-tmprl-0123456789"
	webhookToken   = "WebhookTokenLeakCanary"
	webhookQuery   = "WebhookQueryLeakCanary"
	headerToken    = "HeaderTokenLeakCanary"
	codecKeyPrefix = "Q29kZWNLZXlMZWFrQ2FuYXJ5" // base64 of "CodecKeyLeakCanary"
	natsPassword   = "NatsUrlPasswordLeakCanary"
	rabbitPassword = "RabbitPasswordLeakCanary"
	signingSecret  = "U2lnbmluZ1NlY3JldExlYWtDYW5hcnkwMTIzNDU2Nzg5" // base64 of "SigningSecretLeakCanary0123456789"
)

// codecKey is base64 of 32 bytes: the 18 of the prefix and 14 more.
var codecKey = codecKeyPrefix + base64.StdEncoding.EncodeToString([]byte("0123456789abcd"))

func secrets() []string {
	return []string{dbPassword, apiKey, webhookToken, webhookQuery, headerToken, codecKeyPrefix, codecKey, natsPassword, rabbitPassword, signingSecret}
}

// secretConfig writes a config file with a webhook URL and a topic header that carry
// tokens, a signing secret and broker credentials (in a URL and in a file).
func secretConfig(t *testing.T, extra string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.yaml")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "signing"), []byte("whsec_"+signingSecret+"\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rabbit"), []byte(rabbitPassword), 0o600))
	require.NoError(t, os.WriteFile(path, []byte(`
alerts:
  webhook_url: https://hooks.example.com/services/T0/`+webhookToken+`?token=`+webhookQuery+`
topics:
  order.created:
    url: http://127.0.0.1:1/events
    headers: {Authorization: Bearer `+headerToken+`}
    signing_secrets: ['file:`+filepath.Join(dir, "signing")+`']
  order.published:
    sink: nats
    url: nats://outbox:`+natsPassword+`@127.0.0.1:1
  order.queued:
    sink: rabbitmq
    url: amqp://127.0.0.1:1/
    username: outbox
    password: 'file:`+filepath.Join(dir, "rabbit")+`'
`+extra), 0o600))
	return path
}

// runAll runs args through cli.NewRoot with env and returns everything it printed and
// its error.
func runAll(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	return runFor(t, 30*time.Second, env, args...)
}

// runFor is runAll with the command stopped after d.
func runFor(t *testing.T, d time.Duration, env map[string]string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	root := cli.NewRoot(strings.NewReader(`{"a": 1}`), &out, &out, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := root.ExecuteContext(ctx); err != nil {
		out.WriteString("\nerror: " + err.Error())
	}
	return out.String()
}

func requireNoSecret(t *testing.T, what, output string) {
	t.Helper()
	for _, s := range secrets() {
		require.NotContains(t, output, s, "%s leaks a secret:\n%s", what, output)
	}
}

// commandPaths lists every command of the root, as argument lists.
func commandPaths(root *cobra.Command) [][]string {
	var paths [][]string
	var walk func(c *cobra.Command, prefix []string)
	walk = func(c *cobra.Command, prefix []string) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			p := append(append([]string{}, prefix...), sub.Name())
			paths = append(paths, p)
			walk(sub, p)
		}
	}
	walk(root, nil)
	return paths
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	cfg := secretConfig(t, "")
	unreachable := map[string]string{
		"DATABASE_URL":     "postgres://outbox_user:" + dbPassword + "@127.0.0.1:1/outbox?sslmode=disable&connect_timeout=2",
		"TEMPORAL_API_KEY": apiKey,
		"TEMPORAL_ADDRESS": "127.0.0.1:1",
		"OUTBOX_CODEC_KEY": codecKey,
	}
	root := cli.NewRoot(strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}, func(string) (string, bool) { return "", false })
	paths := commandPaths(root)
	require.GreaterOrEqual(t, len(paths), 10)

	t.Run("Help", func(t *testing.T) {
		t.Parallel()
		requireNoSecret(t, "outbox --help", runAll(t, unreachable, "--help", "--config", cfg))
		for _, p := range paths {
			out := runAll(t, unreachable, append(p, "--help", "--config", cfg)...)
			require.Contains(t, out, "Usage:")
			requireNoSecret(t, strings.Join(p, " ")+" --help", out)
		}
	})

	// Every command against a database that does not answer; the codec server's port is
	// taken.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	argsFor := map[string][]string{
		"enqueue":      {"order.created", "--payload", `{"a": 1}`},
		"dlq show":     {"0192f0c4-0000-7000-8000-000000000000"},
		"dlq redrive":  {"0192f0c4-0000-7000-8000-000000000000"},
		"dlq discard":  {"0192f0c4-0000-7000-8000-000000000000"},
		"codec-server": {"--addr", taken.Addr().String()},
	}
	for _, p := range paths {
		name := strings.Join(p, " ")
		t.Run("Run/"+strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			args := append(append(append([]string{}, p...), argsFor[name]...), "--config", cfg, "--log-level", "debug")
			out := runAll(t, unreachable, args...)
			requireNoSecret(t, name, out)
		})
	}

	t.Run("TemporalUnreachable", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{
			"DATABASE_URL":     testdb.URL(),
			"TEMPORAL_API_KEY": apiKey,
			"TEMPORAL_ADDRESS": "127.0.0.1:1",
			"OUTBOX_CODEC_KEY": codecKey,
		}
		for _, cmd := range []string{"worker", "relay"} {
			out := runAll(t, env, cmd, "--config", secretConfig(t, "schema: outbox_secrets_unused\n"), "--log-level", "debug")
			require.Contains(t, out, "connect to Temporal at 127.0.0.1:1")
			requireNoSecret(t, cmd, out)
		}
	})

	t.Run("CodecServerRunning", func(t *testing.T) {
		t.Parallel()
		out := runFor(t, time.Second, unreachable, "codec-server", "--addr", "127.0.0.1:0", "--config", cfg, "--log-level", "debug")
		require.Contains(t, out, "codec server on http://127.0.0.1:")
		require.Contains(t, out, "Codec server stopped")
		requireNoSecret(t, "codec-server", out)
	})

	t.Run("InvalidSettings", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			env   map[string]string
			extra string
			want  string
		}{
			"BadCodecKey": {
				env:  map[string]string{"DATABASE_URL": unreachable["DATABASE_URL"], "OUTBOX_CODEC_KEY": codecKeyPrefix + "!"},
				want: "OUTBOX_CODEC_KEY",
			},
			"ShortCodecKey": {
				env:  map[string]string{"DATABASE_URL": unreachable["DATABASE_URL"], "OUTBOX_CODEC_KEY": codecKeyPrefix},
				want: "decodes to 18 bytes, want 32",
			},
			"MissingTLSFiles": {
				env:  map[string]string{"DATABASE_URL": unreachable["DATABASE_URL"], "TEMPORAL_API_KEY": apiKey, "TEMPORAL_TLS_CA": "/nonexistent/ca.pem"},
				want: "temporal.tls.ca_file: open /nonexistent/ca.pem",
			},
			"BadWebhookURL": {
				env:   map[string]string{"DATABASE_URL": unreachable["DATABASE_URL"]},
				extra: "default:\n  url: ftp://user:" + dbPassword + "@example.com/x?token=" + webhookQuery + "\n",
				want:  "default.url",
			},
		} {
			out := runAll(t, tc.env, "worker", "--config", secretConfig(t, tc.extra))
			require.Contains(t, out, tc.want, name)
			requireNoSecret(t, name, out)
		}
	})
}
