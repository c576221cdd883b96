// Command enqueue places an order: it writes the order row and its order.created outbox
// message in one transaction, so both commit or neither does.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres go run ./examples/enqueue
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-go/outbox/store"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// The outbox tables (what `outbox migrate` does), and the business table.
	st, err := store.New(pool, store.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, sku text NOT NULL, qty int NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	var orderID int64
	var messageID string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO orders (sku, qty) VALUES ($1, $2) RETURNING id`, "SKU-42", 2).Scan(&orderID); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"order_id": orderID, "sku": "SKU-42", "qty": 2})
		id, err := st.Enqueue(ctx, tx, store.Message{Topic: "order.created", Payload: payload})
		messageID = id.String()
		return err // an error rolls back the order and the message together
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("order %d placed; message %s enqueued\n", orderID, messageID)
}
