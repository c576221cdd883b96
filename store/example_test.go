package store_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// Enqueue joins the business transaction: the order and its message commit together, or
// neither does.
func ExampleStore_Enqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cmp.Or(os.Getenv("TEST_DATABASE_URL"), testdb.DefaultURL))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS outbox_example CASCADE`); err != nil {
		log.Fatal(err)
	}
	st, err := store.New(pool, store.Config{Schema: "outbox_example"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP SCHEMA outbox_example CASCADE`) //nolint:errcheck
	if _, err := pool.Exec(ctx, `CREATE TABLE outbox_example.orders (id bigserial PRIMARY KEY, sku text)`); err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var orderID int64
		if err := tx.QueryRow(ctx, `INSERT INTO outbox_example.orders (sku) VALUES ('SKU-42') RETURNING id`).Scan(&orderID); err != nil {
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
	err = pool.QueryRow(ctx, `SELECT topic, status, payload::text FROM outbox_example.outbox_messages`).Scan(&topic, &status, &payload)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(topic, status, payload)
	// Output: order.created pending {"sku": "SKU-42", "order_id": 1}
}
