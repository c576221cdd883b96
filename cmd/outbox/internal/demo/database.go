package demo

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-go/outbox/store"
)

// database is what the demo services keep in their database, PostgreSQL or MySQL: the
// orders, written with their messages, and the inventory's reservations, one per message.
type database interface {
	// createTables creates the demo's tables if they are missing.
	createTables(ctx context.Context) error
	// createOrder inserts an order and, in the same transaction, runs messages with its ID
	// and an enqueue that writes a message in that transaction. An error from messages
	// rolls the order back.
	createOrder(ctx context.Context, sku string, qty int, messages func(orderID int64, enqueue enqueueFunc) error) (int64, error)
	// order reads an order; found is false when there is none.
	order(ctx context.Context, id int64) (o order, found bool, err error)
	// reserve records the reservation of a message, or counts one more delivery of it
	// when it is there already. It returns the rows written: 1.
	reserve(ctx context.Context, r reservation) (int64, error)
	// reserved reports whether the message was received.
	reserved(ctx context.Context, messageID uuid.UUID) (bool, error)
	// reservations lists the last 100 reservations, newest first.
	reservations(ctx context.Context) ([]reservation, error)
}

// enqueueFunc enqueues a message with payload marshalled as JSON in the order's
// transaction and returns its ID.
type enqueueFunc func(msg store.Message, payload any) (uuid.UUID, error)

// order is a row of demo_orders.
type order struct {
	SKU       string
	Qty       int
	CreatedAt time.Time
}

// reservation is a row of demo_reservations, as GET /reservations shows it.
type reservation struct {
	MessageID  uuid.UUID `json:"message_id"`
	OrderID    int64     `json:"order_id"`
	SKU        string    `json:"sku"`
	Qty        int       `json:"qty"`
	Deliveries int       `json:"deliveries"`
	ReservedAt time.Time `json:"reserved_at"`
}

// postgresDB keeps the demo's tables in PostgreSQL.
type postgresDB struct {
	pool  *pgxpool.Pool
	store *store.Store
}

const postgresSchema = `
CREATE TABLE IF NOT EXISTS demo_orders (
    id         bigserial PRIMARY KEY,
    sku        text NOT NULL,
    qty        integer NOT NULL CHECK (qty > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS demo_reservations (
    message_id  uuid PRIMARY KEY,
    order_id    bigint NOT NULL,
    sku         text NOT NULL,
    qty         integer NOT NULL,
    deliveries  integer NOT NULL DEFAULT 1,
    reserved_at timestamptz NOT NULL DEFAULT now()
);`

func (p *postgresDB) createTables(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, postgresSchema)
	return err
}

func (p *postgresDB) createOrder(ctx context.Context, sku string, qty int, messages func(int64, enqueueFunc) error) (int64, error) {
	var orderID int64
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO demo_orders (sku, qty) VALUES ($1, $2) RETURNING id`, sku, qty).Scan(&orderID); err != nil {
			return err
		}
		return messages(orderID, func(msg store.Message, payload any) (uuid.UUID, error) {
			res, err := p.store.EnqueueJSON(ctx, tx, msg, payload)
			return res.MessageID, err
		})
	})
	return orderID, err
}

func (p *postgresDB) order(ctx context.Context, id int64) (order, bool, error) {
	var o order
	err := p.pool.QueryRow(ctx, `SELECT sku, qty, created_at FROM demo_orders WHERE id = $1`, id).Scan(&o.SKU, &o.Qty, &o.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return order{}, false, nil
	}
	return o, err == nil, err
}

func (p *postgresDB) reserve(ctx context.Context, r reservation) (int64, error) {
	tag, err := p.pool.Exec(ctx, `INSERT INTO demo_reservations (message_id, order_id, sku, qty) VALUES ($1, $2, $3, $4)
ON CONFLICT (message_id) DO UPDATE SET deliveries = demo_reservations.deliveries + 1`, r.MessageID, r.OrderID, r.SKU, r.Qty)
	return tag.RowsAffected(), err
}

func (p *postgresDB) reserved(ctx context.Context, messageID uuid.UUID) (bool, error) {
	var n int
	err := p.pool.QueryRow(ctx, `SELECT count(*) FROM demo_reservations WHERE message_id = $1`, messageID).Scan(&n)
	return n > 0, err
}

func (p *postgresDB) reservations(ctx context.Context) ([]reservation, error) {
	rows, err := p.pool.Query(ctx, `SELECT message_id, order_id, sku, qty, deliveries, reserved_at FROM demo_reservations ORDER BY reserved_at DESC LIMIT 100`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (reservation, error) {
		var v reservation
		err := r.Scan(&v.MessageID, &v.OrderID, &v.SKU, &v.Qty, &v.Deliveries, &v.ReservedAt)
		return v, err
	})
}
