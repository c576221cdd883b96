// Package demo is a small order service and an inventory service that show the outbox at
// work: POST /orders writes an order and its order.created message in one transaction;
// the inventory service receives the message and reserves stock, once per message ID
// however often it is delivered. The inventory service can be told to fail a share of its
// requests, so retries and dead letters can be seen in the Temporal UI.
package demo

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
)

// TopicOrderCreated is the demo's topic.
const TopicOrderCreated = "order.created"

// PoisonSKU is a SKU the inventory service rejects with 422: its message is dead-lettered
// after one attempt.
const PoisonSKU = "POISON"

// Config configures the demo services.
type Config struct {
	Pool  *pgxpool.Pool
	Store *store.Store
	// OrdersAddr is the order service's listen address. Defaults to 127.0.0.1:8080.
	OrdersAddr string
	// InventoryAddr is the inventory service's listen address. Defaults to 127.0.0.1:8081.
	InventoryAddr string
	// FailRate is the share of inventory requests answered with 503 at start (0 to 1).
	FailRate float64
	Logger   *slog.Logger
	// TeamTopics makes each order enqueue the demo teams' messages too (order.points and
	// order.fulfil, see TeamTopics), for a session whose config routes them.
	TeamTopics bool
	// BrokerTopic makes each order enqueue an order.placed message too (see
	// BrokerTopics), for a session whose config routes it to a broker.
	BrokerTopic bool
}

// Topics returns the config that routes the demo's topic to an inventory service at
// inventoryURL (e.g. http://127.0.0.1:8081).
func Topics(inventoryURL string) map[string]config.Topic {
	return map[string]config.Topic{
		TopicOrderCreated: {
			Sink:            "http",
			URL:             inventoryURL + "/events",
			CheckURL:        inventoryURL + "/events/{message_id}",
			MaxAttempts:     5,
			InitialInterval: config.Duration(time.Second),
			Backoff:         2,
			MaxInterval:     config.Duration(10 * time.Second),
			Timeout:         config.Duration(10 * time.Second),
		},
	}
}

// Services are the running demo services.
type Services struct {
	OrdersURL    string
	InventoryURL string
	servers      []*http.Server
	done         chan error
}

const schemaSQL = `
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

// Start creates the demo tables, binds both listeners and serves until Close.
func Start(ctx context.Context, cfg Config) (*Services, error) {
	cfg.OrdersAddr = cmp.Or(cfg.OrdersAddr, "127.0.0.1:8080")
	cfg.InventoryAddr = cmp.Or(cfg.InventoryAddr, "127.0.0.1:8081")
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.FailRate < 0 || cfg.FailRate > 1 {
		return nil, fmt.Errorf("demo fail rate must be between 0 and 1, got %g", cfg.FailRate)
	}
	if _, err := cfg.Pool.Exec(ctx, schemaSQL); err != nil {
		return nil, fmt.Errorf("create demo tables: %w", err)
	}
	ordersL, err := net.Listen("tcp", cfg.OrdersAddr)
	if err != nil {
		return nil, fmt.Errorf("demo order service: %w", err)
	}
	inventoryL, err := net.Listen("tcp", cfg.InventoryAddr)
	if err != nil {
		ordersL.Close()
		return nil, fmt.Errorf("demo inventory service: %w", err)
	}
	inv := &inventory{pool: cfg.Pool, log: cfg.Logger}
	inv.setFailRate(cfg.FailRate)
	s := &Services{
		OrdersURL:    "http://" + ordersL.Addr().String(),
		InventoryURL: "http://" + inventoryL.Addr().String(),
		done:         make(chan error, 2),
	}
	for _, srv := range []struct {
		l net.Listener
		h http.Handler
	}{{ordersL, (&orders{pool: cfg.Pool, store: cfg.Store, teamTopics: cfg.TeamTopics, brokerTopic: cfg.BrokerTopic}).handler()}, {inventoryL, inv.handler()}} {
		hs := &http.Server{Handler: srv.h, ReadHeaderTimeout: 10 * time.Second}
		s.servers = append(s.servers, hs)
		go func() {
			if err := hs.Serve(srv.l); !errors.Is(err, http.ErrServerClosed) {
				s.done <- err
			}
		}()
	}
	return s, nil
}

// Close stops both services, letting requests in flight finish for up to 5 seconds.
func (s *Services) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hs := range s.servers {
		_ = hs.Shutdown(ctx)
	}
}

// Err returns a channel that receives a server's error if it stops serving on its own.
func (s *Services) Err() <-chan error { return s.done }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type orders struct {
	pool        *pgxpool.Pool
	store       *store.Store
	teamTopics  bool // enqueue order.points and order.fulfil too
	brokerTopic bool // enqueue order.placed too
}

type orderRequest struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

func (o *orders) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", o.create)
	mux.HandleFunc("GET /orders/{id}", o.get)
	return mux
}

// create writes the order and its order.created message in one transaction.
func (o *orders) create(w http.ResponseWriter, r *http.Request) {
	req := orderRequest{SKU: "SKU-1", Qty: 1}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body must be JSON like {\"sku\": \"SKU-1\", \"qty\": 2}: " + err.Error()})
			return
		}
	}
	if req.SKU == "" || req.Qty < 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("sku must be set and qty at least 1, got sku %q qty %d", req.SKU, req.Qty)})
		return
	}
	var orderID int64
	var messageID uuid.UUID
	var teamMessages []uuid.UUID
	var brokerMessage uuid.UUID
	err := pgx.BeginFunc(r.Context(), o.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(r.Context(), `INSERT INTO demo_orders (sku, qty) VALUES ($1, $2) RETURNING id`, req.SKU, req.Qty).Scan(&orderID); err != nil {
			return err
		}
		payload := orderPayload{OrderID: orderID, SKU: req.SKU, Qty: req.Qty}
		res, err := o.store.EnqueueJSON(r.Context(), tx, store.Message{Topic: TopicOrderCreated}, payload)
		messageID = res.MessageID
		if err != nil {
			return err
		}
		if o.brokerTopic {
			res, err := o.store.EnqueueJSON(r.Context(), tx, store.Message{Topic: TopicOrderPlaced, OrderingKey: fmt.Sprintf("order-%d", orderID)}, payload)
			if err != nil {
				return err
			}
			brokerMessage = res.MessageID
		}
		if !o.teamTopics {
			return nil
		}
		// The same transaction tells the loyalty and fulfilment teams.
		for _, topic := range []string{TopicOrderPoints, TopicOrderFulfil} {
			res, err := o.store.EnqueueJSON(r.Context(), tx, store.Message{Topic: topic}, payload)
			if err != nil {
				return err
			}
			teamMessages = append(teamMessages, res.MessageID)
		}
		return nil
	})
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	answer := map[string]any{"order_id": orderID, "message_id": messageID, "workflow_id": "outbox-" + messageID.String()}
	if brokerMessage != uuid.Nil {
		answer["placed_message_id"] = brokerMessage
	}
	if len(teamMessages) == 2 {
		answer["points_workflow_id"] = "outbox-" + teamMessages[0].String()
		answer["fulfilment_workflow_id"] = fmt.Sprintf("fulfil-order-%d", orderID)
	}
	writeJSON(w, http.StatusCreated, answer)
}

func (o *orders) get(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "order id must be a number"})
		return
	}
	var sku string
	var qty int
	var created time.Time
	err = o.pool.QueryRow(r.Context(), `SELECT sku, qty, created_at FROM demo_orders WHERE id = $1`, id).Scan(&sku, &qty, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such order"})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"order_id": id, "sku": sku, "qty": qty, "created_at": created})
}

type inventory struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	failRate atomic.Uint64 // the share of requests to fail, in millionths
}

func (inv *inventory) setFailRate(rate float64) { inv.failRate.Store(uint64(rate * 1e6)) }
func (inv *inventory) rate() float64            { return float64(inv.failRate.Load()) / 1e6 }

func (inv *inventory) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events", inv.receive)
	mux.HandleFunc("GET /events/{message_id}", inv.check)
	mux.HandleFunc("POST /fail", inv.fail)
	mux.HandleFunc("GET /reservations", inv.list)
	return mux
}

type event struct {
	MessageID string `json:"message_id"`
	Topic     string `json:"topic"`
	Payload   struct {
		OrderID int64  `json:"order_id"`
		SKU     string `json:"sku"`
		Qty     int    `json:"qty"`
	} `json:"payload"`
}

// receive reserves stock for an order.created event, once per message ID.
func (inv *inventory) receive(w http.ResponseWriter, r *http.Request) {
	if rate := inv.rate(); rate > 0 && rand.Float64() < rate {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("failing %.0f%% of requests (POST /fail?rate=0 to stop)", rate*100)})
		return
	}
	var ev event
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&ev); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body is not an outbox event: " + err.Error()})
		return
	}
	key, err := uuid.Parse(r.Header.Get("Idempotency-Key"))
	if err != nil || key.String() != ev.MessageID {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "Idempotency-Key must be the event's message_id"})
		return
	}
	if ev.Payload.SKU == PoisonSKU {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "SKU " + PoisonSKU + " cannot be reserved"})
		return
	}
	tag, err := inv.pool.Exec(r.Context(), `INSERT INTO demo_reservations (message_id, order_id, sku, qty) VALUES ($1, $2, $3, $4)
ON CONFLICT (message_id) DO UPDATE SET deliveries = demo_reservations.deliveries + 1`, key, ev.Payload.OrderID, ev.Payload.SKU, ev.Payload.Qty)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	inv.log.InfoContext(r.Context(), "Stock reserved", slog.String("message_id", ev.MessageID), slog.Int64("order_id", ev.Payload.OrderID),
		slog.String("attempt", r.Header.Get("Outbox-Attempt")), slog.Int64("rows", tag.RowsAffected()))
	writeJSON(w, http.StatusOK, map[string]any{"reserved": true, "message_id": ev.MessageID})
}

// check answers the outbox's check-processed question: 200 if the message was received.
func (inv *inventory) check(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("message_id"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "message_id must be a UUID"})
		return
	}
	var n int
	if err := inv.pool.QueryRow(r.Context(), `SELECT count(*) FROM demo_reservations WHERE message_id = $1`, id).Scan(&n); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	if n == 0 {
		writeJSON(w, http.StatusNotFound, map[string]any{"processed": false})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"processed": true})
}

// fail sets the share of requests to answer with 503: POST /fail?rate=0.5.
func (inv *inventory) fail(w http.ResponseWriter, r *http.Request) {
	rate, err := strconv.ParseFloat(r.URL.Query().Get("rate"), 64)
	if err != nil || rate < 0 || rate > 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("rate must be a number from 0 to 1, got %q", r.URL.Query().Get("rate"))})
		return
	}
	inv.setFailRate(rate)
	writeJSON(w, http.StatusOK, map[string]any{"fail_rate": rate})
}

func (inv *inventory) list(w http.ResponseWriter, r *http.Request) {
	rows, err := inv.pool.Query(r.Context(), `SELECT message_id, order_id, sku, qty, deliveries, reserved_at FROM demo_reservations ORDER BY reserved_at DESC LIMIT 100`)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	type reservation struct {
		MessageID  uuid.UUID `json:"message_id"`
		OrderID    int64     `json:"order_id"`
		SKU        string    `json:"sku"`
		Qty        int       `json:"qty"`
		Deliveries int       `json:"deliveries"`
		ReservedAt time.Time `json:"reserved_at"`
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (reservation, error) {
		var v reservation
		err := r.Scan(&v.MessageID, &v.OrderID, &v.SKU, &v.Qty, &v.Deliveries, &v.ReservedAt)
		return v, err
	})
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, out)
}
