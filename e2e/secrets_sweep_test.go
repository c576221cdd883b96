package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/workflows"
)

// The sweep's secrets: none may appear in any output, log line, row or history event.
var sweepSecrets = []string{
	"SweepPgPassLeak", "SweepUrlPassLeak", "SweepPathTokenLeak", "SweepQueryLeak", "SweepAlertPassLeak",
	"SweepAlertTokenLeak", "SweepHeaderTokenLeak", "SweepNatsPassLeak", "SweepRabbitPassLeak", "SweepKafkaPassLeak",
	"SweepUiPassLeak", sweepSigningKey,
}

var sweepSigningKey = base64.StdEncoding.EncodeToString([]byte("SweepSigningLeak0123456789abcdef"))

// TestSecretsSweep runs every command against a real database and Temporal server with a
// config whose every URL carries credentials (user and password, a token in the path, a
// key in the query) and whose secrets are references. With the referenced variables
// unset, every command but the worker runs (only the worker reads the secrets), and the
// worker refuses to start, naming the variables. With them set, the worker's attempts fail
// against unreachable endpoints and the messages are dead-lettered. Neither phase shows a
// secret: not in the commands' output and logs, not in the rows, the dead letters or the
// delivery workflows' histories.
func TestSecretsSweep(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	pool, st := testdb.Schema(t)
	closed := testutil.FreePorts(t, 1)[0] // nothing listens there
	dead := fmt.Sprintf("127.0.0.1:%d", closed)
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
schema: %[1]s
ui_url: http://uiuser:SweepUiPassLeak@127.0.0.1:8233
temporal:
  address: %[2]s
  namespace: %[3]s
  task_queue: sweep-%[1]s
relay:
  poll_interval: 200ms
alerts:
  webhook_url: https://alertuser:SweepAlertPassLeak@%[4]s/hooks/SweepAlertTokenLeak?key=SweepQueryLeak
topics:
  order.created:
    url: http://hookuser:SweepUrlPassLeak@%[4]s/services/SweepPathTokenLeak?key=SweepQueryLeak
    check_url: http://hookuser:SweepUrlPassLeak@%[4]s/check/SweepPathTokenLeak/{message_id}?key=SweepQueryLeak
    headers: {Authorization: 'env:OUTBOX_SWEEP_TOKEN'}
    signing_secrets: ['env:OUTBOX_SWEEP_SIGNING']
    alert_webhook: https://alertuser:SweepAlertPassLeak@%[4]s/topic/SweepAlertTokenLeak
    max_attempts: 1
  order.published:
    sink: nats
    url: nats://natsuser:SweepNatsPassLeak@%[4]s
    subject: 'orders.{message_id}'
    max_attempts: 1
  order.queued:
    sink: rabbitmq
    url: amqp://%[4]s/
    username: outbox
    password: 'env:OUTBOX_SWEEP_RABBIT'
    max_attempts: 1
  order.streamed:
    sink: kafka
    brokers: ['%[4]s']
    username: outbox
    password: 'env:OUTBOX_SWEEP_KAFKA'
    tls: {enabled: true}
    max_attempts: 1
`, st.Schema(), ts.GetFrontendHostPort(), ts.GetDefaultNamespace(), dead)), 0o600))
	dbURL := strings.Replace(testdb.URL(), "postgres://postgres@", "postgres://postgres:SweepPgPassLeak@", 1)
	require.Contains(t, dbURL, "SweepPgPassLeak", "the test database URL has the form postgres://postgres@host/db")
	env := map[string]string{"DATABASE_URL": dbURL}
	secretsSet := map[string]string{
		"OUTBOX_SWEEP_TOKEN":   "Bearer SweepHeaderTokenLeak",
		"OUTBOX_SWEEP_SIGNING": "whsec_" + sweepSigningKey,
		"OUTBOX_SWEEP_RABBIT":  "SweepRabbitPassLeak",
		"OUTBOX_SWEEP_KAFKA":   "SweepKafkaPassLeak",
	}
	var outputs []string
	// run runs one command for at most d (then interrupts it) and returns what it printed,
	// followed by "error: exit status N" when it failed (the command prints its error as
	// "outbox: ..." before it exits).
	run := func(d time.Duration, env map[string]string, args ...string) string {
		out, code := runOutbox(t, d, `{"order_id": 42}`, env, append(args, "--config", cfgPath, "--log-level", "debug")...)
		if code != 0 { // 0: ok
			out += fmt.Sprintf("\nerror: exit status %d", code)
		}
		outputs = append(outputs, strings.Join(args, " ")+":\n"+out)
		return out
	}
	uuidIn := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

	// Phase 1: the secrets are referenced, not set. Only the worker needs them.
	require.NotContains(t, run(30*time.Second, env, "migrate"), "error:")
	var ids []uuid.UUID
	for _, topic := range []string{"order.created", "order.published", "order.queued", "order.streamed"} {
		out := run(30*time.Second, env, "enqueue", topic, "--payload", `{"order_id": 42}`)
		require.NotContains(t, out, "error:", out)
		id := uuidIn.FindString(out)
		require.NotEmpty(t, id, out)
		ids = append(ids, uuid.MustParse(id))
	}
	unknown := uuid.NewString()
	for _, args := range [][]string{{"stats"}, {"dlq", "list"}, {"retention", "run"}} {
		out := run(30*time.Second, env, args...)
		require.NotContains(t, out, "error:", "%v runs without the worker's secrets:\n%s", args, out)
	}
	for _, args := range [][]string{{"dlq", "show", ids[0].String()}, {"dlq", "redrive", unknown}, {"dlq", "discard", unknown}} {
		out := run(30*time.Second, env, args...)
		require.NotContains(t, out, "not set or empty", "%v reads no secret:\n%s", args, out)
	}
	out := run(3*time.Second, env, "relay") // runs until stopped
	require.NotContains(t, out, "error:", out)
	for _, cmd := range []string{"worker", "run"} { // run is the worker and the relay in one
		out = run(30*time.Second, env, cmd)
		for _, name := range []string{"OUTBOX_SWEEP_TOKEN", "OUTBOX_SWEEP_SIGNING", "OUTBOX_SWEEP_RABBIT", "OUTBOX_SWEEP_KAFKA"} {
			require.Contains(t, out, "environment variable "+name+" is not set or empty", "outbox %s names what it lacks:\n%s", cmd, out)
		}
	}

	// Phase 2: set, the worker runs; every attempt fails against an endpoint that is down.
	for k, v := range secretsSet {
		env[k] = v
	}
	running := map[string]*outboxProcess{}
	for _, cmd := range []string{"worker", "relay"} {
		running[cmd] = startOutbox(t, "", env, cmd, "--config", cfgPath, "--log-level", "debug")
	}
	// stop interrupts the worker and the relay and keeps what they printed.
	stop := func() {
		for cmd, p := range running {
			code, exited := p.interrupt(30 * time.Second)
			out := p.out.String()
			if !exited {
				out += "\nerror: did not stop within 30s"
			} else if code != 0 { // 0: ok
				out += fmt.Sprintf("\nerror: exit status %d", code)
			}
			outputs = append(outputs, cmd+" (secrets set):\n"+out)
		}
	}
	ctx := context.Background()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Schema()+`.outbox_messages WHERE message_id = ANY($1) AND status = 'dead'`, ids).Scan(&n))
		if n == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, id := range ids {
				var status, lastErr string
				_ = pool.QueryRow(ctx, `SELECT status, coalesce(last_error, '') FROM `+st.Schema()+`.outbox_messages WHERE message_id = $1`, id).Scan(&status, &lastErr)
				fmt.Fprintf(&b, "\n%s %s %s", id, status, lastErr)
			}
			stop()
			for _, o := range outputs {
				if strings.Contains(o, "(secrets set)") {
					b.WriteString("\n" + o[:min(len(o), 3000)])
				}
			}
			t.Fatalf("not every message dead-lettered:%s", b.String())
		}
	}
	stop()
	require.NotContains(t, run(30*time.Second, env, "dlq", "list"), "error:")
	for _, id := range ids {
		require.NotContains(t, run(30*time.Second, env, "dlq", "show", id.String()), "error:")
	}
	run(30*time.Second, env, "stats")

	// Nothing anywhere holds a secret.
	var everything strings.Builder
	for _, o := range outputs {
		everything.WriteString(o + "\n")
	}
	for _, table := range []string{"outbox_messages", "outbox_dead_letters"} {
		rows, err := pool.Query(ctx, `SELECT t::text FROM `+st.Schema()+`.`+table+` t`)
		require.NoError(t, err)
		for rows.Next() {
			var row string
			require.NoError(t, rows.Scan(&row))
			everything.WriteString(table + ": " + row + "\n")
		}
		require.NoError(t, rows.Err())
		rows.Close()
	}
	c := ts.GetDefaultClient()
	for _, id := range ids {
		iter := c.GetWorkflowHistory(ctx, workflows.WorkflowID(id.String()), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		n := 0
		for iter.HasNext() {
			ev, err := iter.Next()
			require.NoError(t, err)
			b, err := protojson.Marshal(ev)
			require.NoError(t, err)
			everything.Write(b)
			everything.WriteString("\n")
			n++
		}
		require.Positive(t, n, "history of %s", id)
	}
	all := everything.String()
	require.Contains(t, all, "POST http://"+dead, "the failures name the endpoint's scheme and host")
	for _, secret := range sweepSecrets {
		if i := strings.Index(all, secret); i >= 0 {
			t.Errorf("secret %s shown:\n%s", secret, all[max(0, i-300):min(len(all), i+100)])
		}
	}
	// The raw bytes of the history payloads are base64 in protojson: check them decoded too.
	var decoded bytes.Buffer
	for _, m := range regexp.MustCompile(`"data":"([A-Za-z0-9+/=]+)"`).FindAllStringSubmatch(all, -1) {
		if b, err := base64.StdEncoding.DecodeString(m[1]); err == nil {
			decoded.Write(b)
			decoded.WriteString("\n")
		}
	}
	for _, secret := range sweepSecrets {
		require.NotContains(t, decoded.String(), secret, "a history payload shows a secret")
	}
}
