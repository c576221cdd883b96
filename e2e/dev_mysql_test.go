package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// mysqlPIDPattern finds the private server's URL and process ID in the summary of outbox
// dev --database mysql.
var mysqlPIDPattern = regexp.MustCompile(`(mysql://\S+)\s+\(pid (\d+),`)

// envDatabaseURL reads DATABASE_URL from the env file of a dev folder.
var envDatabaseURL = regexp.MustCompile(`(?m)^export DATABASE_URL='([^']+)'$`)

// TestDevMySQL runs `outbox dev --database mysql` as a user does: a private MariaDB (or
// MySQL) server is made in the dev folder, an order goes through the demo, whose tables
// are in that server too, and the outbox; SIGINT stops everything, the server included; a
// restart finds the data and the port again. Temporal is an in-process test server, so
// the test takes seconds.
func TestDevMySQL(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	ts := newServer(t)
	dir := filepath.Join(t.TempDir(), "dev")
	// Should the test fail with the server running, the cleanup of startDev kills outbox
	// dev, whose death stops the server; this waits for that before the folder goes.
	var serverPID int
	t.Cleanup(func() {
		for deadline := time.Now().Add(30 * time.Second); serverPID != 0 && alive(serverPID) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	})

	ports := testutil.FreePorts(t, 2)
	ordersURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	inventoryURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	env := append(devEnv(), "TEMPORAL_ADDRESS="+ts.GetFrontendHostPort(), "TEMPORAL_NAMESPACE="+ts.GetDefaultNamespace())
	args := []string{"--database", "mysql", "--dir", dir,
		"--orders-addr", strings.TrimPrefix(ordersURL, "http://"), "--inventory-addr", strings.TrimPrefix(inventoryURL, "http://")}
	ctx := context.Background()

	// start starts outbox dev and returns it and the URL of its database.
	start := func() (*devProcess, string) {
		t.Helper()
		p := startDev(t, bin, env, args...)
		p.waitReadyWithin(t, 2*time.Minute)
		m := mysqlPIDPattern.FindStringSubmatch(p.stdout.String())
		require.NotNil(t, m, "the summary names the MySQL URL and pid:\n%s", p.stdout)
		serverPID, _ = strconv.Atoi(m[2])
		require.True(t, alive(serverPID))
		envFile, err := os.ReadFile(filepath.Join(dir, "env"))
		require.NoError(t, err)
		e := envDatabaseURL.FindStringSubmatch(string(envFile))
		require.NotNil(t, e, "the env file exports DATABASE_URL:\n%s", envFile)
		require.Equal(t, m[1], e[1], "the env file names the server of the summary")
		require.Regexp(t, `^mysql://root@127\.0\.0\.1:\d+/outbox$`, e[1])
		return p, e[1]
	}
	// stop stops outbox dev with SIGINT, as Ctrl-C does, and checks that the server went
	// with it and nothing of the dev folder runs.
	stop := func(p *devProcess) {
		t.Helper()
		p.interrupt(t, 60*time.Second)
		require.Eventually(t, func() bool { return !alive(serverPID) }, 10*time.Second, 50*time.Millisecond, "the MariaDB server outlived outbox dev")
		procs, _ := exec.Command("pgrep", "-f", dir).Output()
		require.Empty(t, strings.TrimSpace(string(procs)), "no process of the dev folder is left")
	}

	p, dbURL := start()

	// An order through the demo API.
	resp, err := http.Post(ordersURL+"/orders", "application/json", strings.NewReader(`{"sku": "SKU-5", "qty": 4}`))
	require.NoError(t, err)
	var order struct {
		OrderID   int64     `json:"order_id"`
		MessageID uuid.UUID `json:"message_id"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&order))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// Delivered: the inventory service lists the reservation, and the row is sent, as the
	// database the env file names says.
	require.Eventually(t, func() bool {
		resp, err := http.Get(inventoryURL + "/reservations")
		require.NoError(t, err)
		defer resp.Body.Close()
		var reservations []struct {
			MessageID uuid.UUID `json:"message_id"`
			OrderID   int64     `json:"order_id"`
			Qty       int       `json:"qty"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&reservations))
		return len(reservations) == 1 && reservations[0].MessageID == order.MessageID && reservations[0].OrderID == order.OrderID && reservations[0].Qty == 4
	}, 60*time.Second, 100*time.Millisecond)
	db, err := mysqlstore.Open(ctx, dbURL)
	require.NoError(t, err)
	defer db.Close()
	status := func(id uuid.UUID) string {
		var s string
		require.NoError(t, db.QueryRowContext(ctx, `SELECT status FROM outbox_messages WHERE message_id = ?`, id.String()).Scan(&s))
		return s
	}
	require.Eventually(t, func() bool { return status(order.MessageID) == "sent" }, 30*time.Second, 100*time.Millisecond)
	// The demo teams' messages of the order, enqueued in its transaction, are sent too.
	require.Eventually(t, func() bool {
		var sent int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM outbox_messages WHERE topic IN ('order.points', 'order.fulfil')
			AND JSON_EXTRACT(payload, '$.order_id') = ? AND status = 'sent'`, order.OrderID).Scan(&sent))
		return sent == 2
	}, 60*time.Second, 100*time.Millisecond)
	require.NoError(t, db.Close())
	stop(p)

	// A restart finds the data folder, and the port, of the first run.
	p, restartURL := start()
	require.Equal(t, dbURL, restartURL, "the last run's port")
	db, err = mysqlstore.Open(ctx, dbURL)
	require.NoError(t, err)
	require.Equal(t, "sent", status(order.MessageID))
	require.NoError(t, db.Close())
	stop(p)
}
