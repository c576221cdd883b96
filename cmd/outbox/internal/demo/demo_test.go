package demo

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// backend is a database the demo runs on in a test: the config of the demo on it (its
// outbox store limited to maxPayload bytes, 0 for the default) and a query that counts.
type backend struct {
	config   func(t *testing.T, maxPayload int) Config
	count    func(t *testing.T, query string) int
	messages string // the outbox messages table, as a query names it
}

func postgresBackend(t *testing.T) backend {
	ctx := context.Background()
	_, st := testdb.Schema(t)
	// The demo's tables go to the first schema of the search path: the test's own.
	pc, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["search_path"] = st.Schema()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return backend{
		config: func(t *testing.T, maxPayload int) Config {
			s, err := store.New(pool, store.Config{Schema: st.Schema(), MaxPayloadBytes: maxPayload})
			require.NoError(t, err)
			return Config{Pool: pool, Store: s}
		},
		count: func(t *testing.T, query string) int {
			var n int
			require.NoError(t, pool.QueryRow(ctx, query).Scan(&n), query)
			return n
		},
		messages: st.Schema() + ".outbox_messages",
	}
}

func mysqlBackend(t *testing.T) backend {
	ctx := context.Background()
	serverURL := cmp.Or(os.Getenv("TEST_MYSQL_URL"), "mysql://root@127.0.0.1:3306/test")
	admin, err := mysqlstore.Open(ctx, serverURL)
	require.NoError(t, err, "MySQL at %s (set TEST_MYSQL_URL, or run scripts/services.sh)", serverURL)
	t.Cleanup(func() { _ = admin.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "outbox_demo_test_" + hex.EncodeToString(b)
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name) })
	u, err := url.Parse(serverURL)
	require.NoError(t, err)
	u.Path = "/" + name
	db, err := mysqlstore.Open(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	require.NoError(t, err)
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	return backend{
		config: func(t *testing.T, maxPayload int) Config {
			s, err := mysqlstore.New(db, mysqlstore.Config{MaxPayloadBytes: maxPayload})
			require.NoError(t, err)
			return Config{MySQL: s}
		},
		count: func(t *testing.T, query string) int {
			var n int
			require.NoError(t, db.QueryRowContext(ctx, query).Scan(&n), query)
			return n
		},
		messages: "outbox_messages",
	}
}

// TestServices runs the demo services on PostgreSQL and on MySQL: an order and its
// messages are written in one transaction (an enqueue that fails leaves no order), and the
// inventory reserves once per message ID, counting deliveries.
func TestServices(t *testing.T) {
	for name, newBackend := range map[string]func(*testing.T) backend{"PostgreSQL": postgresBackend, "MySQL": mysqlBackend} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t)
			start := func(cfg Config) *Services {
				cfg.OrdersAddr, cfg.InventoryAddr, cfg.TeamTopics = "127.0.0.1:0", "127.0.0.1:0", true
				cfg.Logger = slog.New(slog.DiscardHandler)
				s, err := Start(context.Background(), cfg)
				require.NoError(t, err)
				t.Cleanup(s.Close)
				return s
			}
			s := start(b.config(t, 0))

			code, body := call(t, http.MethodGet, s.InventoryURL+"/reservations", "", nil)
			require.Equal(t, http.StatusOK, code)
			require.JSONEq(t, `[]`, body)

			// An order and its three messages.
			code, body = call(t, http.MethodPost, s.OrdersURL+"/orders", `{"sku": "SKU-2", "qty": 2}`, nil)
			require.Equal(t, http.StatusCreated, code, body)
			var created struct {
				OrderID   int64     `json:"order_id"`
				MessageID uuid.UUID `json:"message_id"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &created))
			require.Equal(t, int64(1), created.OrderID)
			require.Equal(t, 3, b.count(t, fmt.Sprintf(`SELECT count(*) FROM %s WHERE topic IN ('order.created', 'order.points', 'order.fulfil')`, b.messages)))
			require.Equal(t, 1, b.count(t, fmt.Sprintf(`SELECT count(*) FROM %s WHERE message_id = '%s' AND topic = 'order.created'`, b.messages, created.MessageID)))

			code, body = call(t, http.MethodGet, fmt.Sprintf("%s/orders/%d", s.OrdersURL, created.OrderID), "", nil)
			require.Equal(t, http.StatusOK, code, body)
			var got struct {
				SKU string `json:"sku"`
				Qty int    `json:"qty"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &got))
			require.Equal(t, "SKU-2", got.SKU)
			require.Equal(t, 2, got.Qty)
			code, _ = call(t, http.MethodGet, s.OrdersURL+"/orders/99", "", nil)
			require.Equal(t, http.StatusNotFound, code)

			// Delivered twice, reserved once.
			check := s.InventoryURL + "/events/" + created.MessageID.String()
			code, _ = call(t, http.MethodGet, check, "", nil)
			require.Equal(t, http.StatusNotFound, code)
			event := fmt.Sprintf(`{"message_id": %q, "topic": "order.created", "payload": {"order_id": %d, "sku": "SKU-2", "qty": 2}}`, created.MessageID, created.OrderID)
			for range 2 {
				code, body = call(t, http.MethodPost, s.InventoryURL+"/events", event, map[string]string{"Idempotency-Key": created.MessageID.String()})
				require.Equal(t, http.StatusOK, code, body)
			}
			code, _ = call(t, http.MethodGet, check, "", nil)
			require.Equal(t, http.StatusOK, code)
			code, body = call(t, http.MethodGet, s.InventoryURL+"/reservations", "", nil)
			require.Equal(t, http.StatusOK, code)
			var reservations []reservation
			require.NoError(t, json.Unmarshal([]byte(body), &reservations))
			require.Len(t, reservations, 1)
			r := reservations[0]
			require.Equal(t, reservation{MessageID: created.MessageID, OrderID: created.OrderID, SKU: "SKU-2", Qty: 2, Deliveries: 2}, reservation{
				MessageID: r.MessageID, OrderID: r.OrderID, SKU: r.SKU, Qty: r.Qty, Deliveries: r.Deliveries})
			require.False(t, r.ReservedAt.IsZero())

			// A message the store refuses rolls its order back.
			small := start(b.config(t, 10))
			code, body = call(t, http.MethodPost, small.OrdersURL+"/orders", `{"sku": "SKU-3", "qty": 1}`, nil)
			require.Equal(t, http.StatusInternalServerError, code, body)
			require.Contains(t, body, "payload")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM demo_orders`))
		})
	}
}

func TestConfigDatabase(t *testing.T) {
	_, err := (&Config{}).database()
	require.ErrorContains(t, err, "set Pool and Store (PostgreSQL) or MySQL (MySQL, MariaDB)")
	_, err = (&Config{DB: &sql.DB{}}).database()
	require.ErrorContains(t, err, "DB is set without MySQL")
	_, err = (&Config{Store: &store.Store{}, MySQL: &mysqlstore.Store{}}).database()
	require.ErrorContains(t, err, "not both")
}

// call makes a request and returns the status code and the body.
func call(t *testing.T, method, url, body string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
