package e2e

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// mysqlURL is the MariaDB or MySQL server the tests create their databases on.
func mysqlURL() string {
	return cmp.Or(os.Getenv("TEST_MYSQL_URL"), "mysql://root@127.0.0.1:3306/test")
}

// mysqlDatabase creates an empty database of the test's own on the test server and
// returns its URL and a connection to it; the database is dropped when the test ends.
func mysqlDatabase(t *testing.T) (string, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	admin, err := mysqlstore.Open(ctx, mysqlURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "outbox_e2e_" + hex.EncodeToString(b)
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name) })
	u, err := url.Parse(mysqlURL())
	require.NoError(t, err)
	u.Path = "/" + name
	db, err := mysqlstore.Open(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return u.String(), db
}

// mariadbClient runs statements with the mariadb (or mysql) command-line client against
// the database dbURL names, as a PHP or shell writer of the seed's table would.
func mariadbClient(t *testing.T, dbURL, statements string) {
	t.Helper()
	client, err := exec.LookPath("mariadb")
	if err != nil {
		client, err = exec.LookPath("mysql")
	}
	require.NoError(t, err, "the mariadb client is installed with the server")
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	password, _ := u.User.Password()
	cmd := exec.Command(client, "--protocol=TCP", "-h", u.Hostname(), "-P", cmp.Or(u.Port(), "3306"),
		"-u", u.User.Username(), strings.TrimPrefix(u.Path, "/"), "-e", statements)
	cmd.Env = append(os.Environ(), "MYSQL_PWD="+password)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s\n%s", statements, out)
}

// mysqlStatus returns the status and last error of each row of a topic, by message ID.
func mysqlStatus(t *testing.T, db *sql.DB, topic string) map[string][2]string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(),
		"SELECT message_id, status, COALESCE(last_error, '') FROM outbox_messages WHERE topic = ?", topic)
	require.NoError(t, err)
	defer rows.Close()
	got := map[string][2]string{}
	for rows.Next() {
		var id, status, lastErr string
		require.NoError(t, rows.Scan(&id, &status, &lastErr))
		got[id] = [2]string{status, lastErr}
	}
	require.NoError(t, rows.Err())
	return got
}

// TestMySQLDelivery runs the outbox command on MariaDB as a team on MySQL runs it: outbox
// migrate, then outbox worker and outbox relay as separate processes against a real
// Temporal server, with rows written by the mariadb client the seed's way (only topic and
// payload, or with the seed's status, retry_times, max_retry_times and next_retry_at).
// Every accepted row ends sent and reached the downstream; a row the downstream rejects
// ends dead with the downstream's answer as its reason, which outbox dlq list, dlq show and
// show report; outbox dlq discard discards one such message and outbox dlq redrive sends
// another again (dead once more, with a second dead letter), and outbox enqueue adds a
// message. Then the worker and the relay are killed (SIGKILL) while 60 more rows are under
// way and started again: every row ends sent and reached the downstream, none is lost.
// outbox stats counts the rows by status, and outbox retention run removes the sent and
// discarded ones once they are old. The topics keep the default retry policy.
func TestMySQLDelivery(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	recv := newReceiver(t)
	recv.Handle("POST /rejects", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "order 7 is unknown", http.StatusUnprocessableEntity)
	})
	dbURL, db := mysqlDatabase(t)
	cfgPath := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
temporal:
  address: %s
  namespace: %s
  task_queue: mysql-%d
relay:
  poll_interval: 200ms
topics:
  order.created:
    url: %[4]s/events
  order.rejected:
    url: %[4]s/rejects
`, ts.GetFrontendHostPort(), ts.GetDefaultNamespace(), time.Now().UnixNano(), recv.URL)), 0o600))
	env := map[string]string{"DATABASE_URL": dbURL}

	out, code := runOutbox(t, time.Minute, "", env, "migrate", "--config", cfgPath)
	require.Equal(t, 0, code, out) // 0: ok
	mariadbClient(t, dbURL, `
INSERT INTO outbox_messages (topic, payload) VALUES ('order.created', '{"order_id": 1}');
INSERT INTO outbox_messages (topic, payload, status, retry_times, max_retry_times, next_retry_at)
    VALUES ('order.created', '{"order_id": 2}', 'pending', 0, 5, NOW());
INSERT INTO outbox_messages (topic, payload) VALUES ('order.rejected', '{"order_id": 7}'), ('order.rejected', '{"order_id": 8}');`)

	start := func(cmd string) *outboxProcess {
		return startOutbox(t, "", env, cmd, "--config", cfgPath)
	}
	worker, relay := start("worker"), start("relay")
	out, code = runOutbox(t, time.Minute, "", env, "enqueue", "order.created", "--payload", `{"order_id": 3}`, "--config", cfgPath)
	require.Equal(t, 0, code, out) // 0: ok
	lines := strings.Split(strings.TrimSpace(out), "\n")
	enqueued := lines[len(lines)-1] // the message ID, after any log line
	logs := func() string { return "worker:\n" + worker.out.String() + "\nrelay:\n" + relay.out.String() }
	settled := func(topic, status string, n int) func() bool {
		return func() bool {
			rows := mysqlStatus(t, db, topic)
			for _, r := range rows {
				if r[0] != status {
					return false
				}
			}
			return len(rows) == n
		}
	}
	require.Eventually(t, settled("order.created", "sent", 3), 2*time.Minute, 100*time.Millisecond, logs)
	require.Contains(t, mysqlStatus(t, db, "order.created"), enqueued, "outbox enqueue printed the message's ID")
	require.Eventually(t, settled("order.rejected", "dead", 2), 2*time.Minute, 100*time.Millisecond, logs)
	for id := range mysqlStatus(t, db, "order.created") {
		_, effects := recv.Count(id)
		require.Equal(t, 1, effects, "message %s reached the downstream once", id)
	}
	for _, r := range mysqlStatus(t, db, "order.rejected") {
		require.Contains(t, r[1], "order 7 is unknown", "the dead letter's reason is the downstream's answer")
	}
	var dead int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM outbox_dead_letters").Scan(&dead))
	require.Equal(t, 2, dead)

	// The operators' commands on MySQL: list, show, the delivery story, discard and redrive
	// (both audited).
	var rejected, redriven string
	for id := range mysqlStatus(t, db, "order.rejected") {
		if rejected == "" {
			rejected = id
		} else {
			redriven = id
		}
	}
	cli := func(args ...string) string {
		t.Helper()
		out, code := runOutbox(t, time.Minute, "", env, append(args, "--config", cfgPath)...)
		require.Equal(t, 0, code, "outbox %s:\n%s", strings.Join(args, " "), out) // 0: ok
		return out
	}
	require.Contains(t, cli("dlq", "list"), rejected)
	require.Contains(t, cli("dlq", "show", rejected), "order 7 is unknown")
	require.Contains(t, cli("show", rejected), "order 7 is unknown")
	cli("dlq", "discard", rejected, "--yes")
	require.Equal(t, "discarded", mysqlStatus(t, db, "order.rejected")[rejected][0])
	require.Contains(t, cli("dlq", "show", rejected), "discard")
	require.Contains(t, cli("dlq", "redrive", redriven), "redriven "+redriven+" (order.rejected, redrive 1)")
	require.Eventually(t, func() bool {
		var letters, redrives int
		require.NoError(t, db.QueryRow("SELECT count(*) FROM outbox_dead_letters WHERE message_id = ?", redriven).Scan(&letters))
		require.NoError(t, db.QueryRow("SELECT redrive_count FROM outbox_messages WHERE message_id = ?", redriven).Scan(&redrives))
		return letters == 2 && redrives == 1 && mysqlStatus(t, db, "order.rejected")[redriven][0] == "dead"
	}, 2*time.Minute, 100*time.Millisecond, "the redriven message was sent again and dead-lettered once more: %s", logs)
	require.Contains(t, cli("dlq", "show", redriven), "redrive")

	// kill -9 of both processes mid-flight: nothing is lost.
	var values []string
	for i := range 60 {
		values = append(values, fmt.Sprintf(`('order.created', '{"order_id": %d}')`, 100+i))
	}
	mariadbClient(t, dbURL, "INSERT INTO outbox_messages (topic, payload) VALUES "+strings.Join(values, ", "))
	require.Eventually(t, func() bool {
		_, effects := recv.Totals()
		return effects >= 3+5
	}, time.Minute, 10*time.Millisecond, logs)
	require.NoError(t, worker.cmd.Process.Kill())
	require.NoError(t, relay.cmd.Process.Kill())
	worker.wait()
	relay.wait()
	worker, relay = start("worker"), start("relay")
	require.Eventually(t, settled("order.created", "sent", 63), 3*time.Minute, 100*time.Millisecond, logs)
	for id := range mysqlStatus(t, db, "order.created") {
		_, effects := recv.Count(id)
		require.Equal(t, 1, effects, "message %s reached the downstream", id)
	}
	require.Empty(t, recv.Snapshot().Bad, "every request kept the downstream contract")

	for _, p := range []*outboxProcess{worker, relay} {
		code, exited := p.interrupt(30 * time.Second)
		require.True(t, exited, logs())
		require.Equal(t, 0, code, logs()) // 0: ok
	}
	var stats struct {
		ByStatus map[string]int64 `json:"by_status"`
	}
	require.NoError(t, json.Unmarshal([]byte(cli("stats", "--json")), &stats))
	require.Equal(t, map[string]int64{"sent": 63, "dead": 1, "discarded": 1}, nonZero(stats.ByStatus))

	// Retention removes sent and discarded messages (with their dead letters) once they are
	// older than the defaults keep them.
	mariadbClient(t, dbURL, `
UPDATE outbox_messages SET sent_at = NOW(6) - INTERVAL 400 DAY, updated_at = NOW(6) - INTERVAL 400 DAY WHERE status = 'sent';
UPDATE outbox_messages SET updated_at = NOW(6) - INTERVAL 400 DAY WHERE status = 'discarded';
UPDATE outbox_dead_letters SET discarded_at = NOW(6) - INTERVAL 400 DAY WHERE discarded_at IS NOT NULL;`)
	var purged map[string]any
	require.NoError(t, json.Unmarshal([]byte(cli("retention", "run", "--json")), &purged))
	require.Equal(t, 63.0, purged["sent_messages"], purged)
	require.Equal(t, 1.0, purged["discarded_messages"], purged)
	require.Equal(t, 1.0, purged["dead_letters"], purged)
	require.Empty(t, mysqlStatus(t, db, "order.created"))
	require.Equal(t, []string{redriven}, slices.Collect(maps.Keys(mysqlStatus(t, db, "order.rejected"))), "the dead message stays")
}

// nonZero returns the entries of m that are not zero.
func nonZero(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// TestEmbeddedOnMySQL runs the outbox from Go as a team on MySQL embeds it: app.Open with
// mysqlstore.OpenDatabase for database_url's MySQL form, Migrate, and Run (relay and worker
// in one process) against a real Temporal server; a message enqueued through the App and
// one enqueued in the team's own transaction are both delivered. A database_url the
// opener cannot use is a config error, a server that does not answer an unavailable one.
func TestEmbeddedOnMySQL(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	recv := newReceiver(t)
	ctx := context.Background()
	dbURL, db := mysqlDatabase(t)
	opts := app.Options{Logger: logger, Databases: map[string]app.DatabaseOpener{config.DatabaseMySQL: mysqlstore.OpenDatabase}}
	cfg := func(url string) *config.Config {
		return &config.Config{
			DatabaseURL: url,
			Temporal:    config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: ts.GetDefaultNamespace(), TaskQueue: fmt.Sprintf("embedded-mysql-%d", time.Now().UnixNano())},
			Topics:      map[string]config.Topic{"order.created": {URL: recv.URL + "/events"}},
		}
	}

	_, err := app.Open(ctx, cfg(dbURL+"?tls=no-such-config"), opts)
	require.True(t, app.IsConfigError(err), "%v", err)
	_, err = app.Open(ctx, cfg("mysql://root@127.0.0.1:1/test"), opts)
	require.True(t, app.IsUnavailable(err), "%v", err)
	_, err = app.Open(ctx, cfg(dbURL), app.Options{Logger: logger})
	require.True(t, app.IsConfigError(err), "%v", err)
	require.ErrorContains(t, err, "mysqlstore.OpenDatabase")

	a, err := app.Connect(ctx, cfg(dbURL), opts)
	require.NoError(t, err)
	t.Cleanup(a.Close)
	require.Equal(t, "mysql", a.Driver.Kind())
	_, err = a.Migrate(ctx)
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx, app.Handlers{}) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})

	viaApp, err := a.Enqueue(ctx, mysqlstore.Message{Topic: "order.created", Payload: []byte(`{"order_id": 1}`)})
	require.NoError(t, err)
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	viaTx, err := st.Enqueue(ctx, tx, mysqlstore.Message{Topic: "order.created", Payload: []byte(`{"order_id": 2}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	for _, id := range []string{viaApp.String(), viaTx.String()} {
		require.Eventually(t, func() bool { return mysqlStatus(t, db, "order.created")[id][0] == "sent" },
			time.Minute, 50*time.Millisecond, "message %s", id)
		_, effects := recv.Count(id)
		require.Equal(t, 1, effects, "message %s reached the downstream once", id)
	}
}
