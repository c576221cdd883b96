package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// mysqlDB keeps the demo's tables in MySQL or MariaDB, beside the outbox's.
type mysqlDB struct {
	db    *sql.DB
	store *mysqlstore.Store
}

// mysqlSchema is the demo's tables as MySQL writes them: one statement each, as the
// driver runs one statement per call. Times are TIMESTAMP(6), which a connection opened
// with mysqlstore.Open reads and writes in UTC.
var mysqlSchema = []string{
	`CREATE TABLE IF NOT EXISTS demo_orders (
    id         BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    sku        TEXT NOT NULL,
    qty        INT NOT NULL CHECK (qty > 0),
    created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
)`,
	`CREATE TABLE IF NOT EXISTS demo_reservations (
    message_id  CHAR(36) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    order_id    BIGINT NOT NULL,
    sku         TEXT NOT NULL,
    qty         INT NOT NULL,
    deliveries  INT NOT NULL DEFAULT 1,
    reserved_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
)`,
}

func (m *mysqlDB) createTables(ctx context.Context) error {
	for _, q := range mysqlSchema {
		if _, err := m.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

func (m *mysqlDB) createOrder(ctx context.Context, sku string, qty int, messages func(int64, enqueueFunc) error) (int64, error) {
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, `INSERT INTO demo_orders (sku, qty) VALUES (?, ?)`, sku, qty)
	if err != nil {
		return 0, err
	}
	orderID, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	err = messages(orderID, func(msg store.Message, payload any) (uuid.UUID, error) {
		res, err := m.store.EnqueueJSON(ctx, tx, msg, payload)
		return res.MessageID, err
	})
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit the order: %w", err)
	}
	return orderID, nil
}

func (m *mysqlDB) order(ctx context.Context, id int64) (order, bool, error) {
	var o order
	err := m.db.QueryRowContext(ctx, `SELECT sku, qty, created_at FROM demo_orders WHERE id = ?`, id).Scan(&o.SKU, &o.Qty, &o.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return order{}, false, nil
	}
	return o, err == nil, err
}

func (m *mysqlDB) reserve(ctx context.Context, r reservation) (int64, error) {
	res, err := m.db.ExecContext(ctx, `INSERT INTO demo_reservations (message_id, order_id, sku, qty) VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE deliveries = deliveries + 1`, r.MessageID.String(), r.OrderID, r.SKU, r.Qty)
	if err != nil {
		return 0, err
	}
	// MySQL counts an update of a duplicate as 2 rows; it is the one row, as PostgreSQL says.
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return n, err
	}
	return 1, nil
}

func (m *mysqlDB) reserved(ctx context.Context, messageID uuid.UUID) (bool, error) {
	var n int
	err := m.db.QueryRowContext(ctx, `SELECT count(*) FROM demo_reservations WHERE message_id = ?`, messageID.String()).Scan(&n)
	return n > 0, err
}

func (m *mysqlDB) reservations(ctx context.Context) ([]reservation, error) {
	rows, err := m.db.QueryContext(ctx, `SELECT message_id, order_id, sku, qty, deliveries, reserved_at FROM demo_reservations ORDER BY reserved_at DESC LIMIT 100`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []reservation{} // [] in JSON when there is none, as PostgreSQL's answers
	for rows.Next() {
		var v reservation
		if err := rows.Scan(&v.MessageID, &v.OrderID, &v.SKU, &v.Qty, &v.Deliveries, &v.ReservedAt); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
