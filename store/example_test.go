package store_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"math/rand/v2"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-go/outbox/store"
)

// exampleStore connects to the PostgreSQL of TEST_DATABASE_URL (a local one by default),
// migrates the outbox tables into a fresh schema, makes that schema the connections' search
// path and creates the business table orders in it. The returned function drops the schema
// and closes the pool.
func exampleStore(ctx context.Context) (*pgxpool.Pool, *store.Store, func()) {
	url := cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		log.Fatal(err)
	}
	schema := fmt.Sprintf("outbox_example_%08x", rand.Uint32())
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	st, err := store.New(pool, store.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, sku text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	return pool, st, func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		pool.Close()
	}
}

// Enqueue joins the business transaction: the order and its message commit together, or
// neither does.
func ExampleStore_Enqueue() {
	ctx := context.Background()
	pool, st, cleanup := exampleStore(ctx)
	defer cleanup()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var orderID int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (sku) VALUES ('SKU-42') RETURNING id`).Scan(&orderID); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"order_id": orderID, "sku": "SKU-42"})
		_, err := st.Enqueue(ctx, tx, store.Message{Topic: "order.created", Payload: payload})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	var topic, status, payload string
	err = pool.QueryRow(ctx, `SELECT topic, status, payload::text FROM outbox_messages`).Scan(&topic, &status, &payload)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(topic, status, payload)
	// Output: order.created pending {"sku": "SKU-42", "order_id": 1}
}

// A message enqueued in the business transaction is a pending row once the transaction
// commits; the relay hands it to Temporal from there. Get reads it back by the message
// ID that Enqueue returned.
func ExampleStore_Get() {
	ctx := context.Background()
	pool, st, cleanup := exampleStore(ctx) // a pool and a Store on a migrated schema
	defer cleanup()

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var orderID int64
	if err := tx.QueryRow(ctx, `INSERT INTO orders (sku) VALUES ('SKU-7') RETURNING id`).Scan(&orderID); err != nil {
		log.Fatal(err)
	}
	id, err := st.Enqueue(ctx, tx, store.Message{
		Topic:   "order.created",
		Payload: json.RawMessage(fmt.Sprintf(`{"order_id": %d}`, orderID)),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	row, err := st.Get(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(row.Topic, row.Status, row.RetryTimes)
	// Output: order.created pending 0
}

// An IdempotencyKey makes a repeated Enqueue harmless: while a row holds the key, another
// message with it writes nothing and reports Duplicate, without an error, so a retried
// request handler does not send the event twice.
func ExampleStore_EnqueueMessage_idempotencyKey() {
	ctx := context.Background()
	pool, st, cleanup := exampleStore(ctx) // a pool and a Store on a migrated schema
	defer cleanup()

	msg := store.Message{
		Topic:          "order.paid",
		Payload:        json.RawMessage(`{"order_id": 42}`),
		IdempotencyKey: "order-42-paid",
	}
	first, err := st.EnqueueMessage(ctx, pool, msg)
	if err != nil {
		log.Fatal(err)
	}
	again, err := st.EnqueueMessage(ctx, pool, msg) // the same request, retried
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first duplicate:", first.Duplicate)
	fmt.Println("again duplicate:", again.Duplicate)
	fmt.Println("same message:", again.MessageID == first.MessageID)

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows:", n)
	// Output:
	// first duplicate: false
	// again duplicate: true
	// same message: true
	// rows: 1
}
