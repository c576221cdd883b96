// Package demo is a small order service and an inventory service that show the outbox at
// work: POST /orders writes an order and its order.created message in one transaction;
// the inventory service receives the message and reserves stock, once per message ID
// however often it is delivered. The inventory service can be told to fail a share of its
// requests, so retries and dead letters can be seen in the Temporal UI. Both keep their
// tables in the outbox's database, PostgreSQL or MySQL (MariaDB).
package demo

import (
	"cmp"
	"context"
	"database/sql"
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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// TopicOrderCreated is the demo's topic.
const TopicOrderCreated = "order.created"

// PoisonSKU is a SKU the inventory service rejects with 422: its message is dead-lettered
// after one attempt.
const PoisonSKU = "POISON"

// Config configures the demo services. They keep their tables beside the outbox's, in
// PostgreSQL (Pool and Store) or in MySQL or MariaDB (MySQL, and DB); UseApp sets these
// from an App.
type Config struct {
	// Pool and Store are the PostgreSQL database and its outbox store.
	Pool  *pgxpool.Pool
	Store *store.Store
	// MySQL is the outbox store of a MySQL or MariaDB database, and DB the connections the
	// demo writes its own rows with (defaults to MySQL.DB()); open a DB of your own with
	// mysqlstore.Open, which reads times as UTC.
	MySQL *mysqlstore.Store
	DB    *sql.DB
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

// UseApp sets the demo's database to a's: Pool and Store on PostgreSQL, MySQL on MySQL or
// MariaDB. Any other database is an error that names it.
func (c *Config) UseApp(a *app.App) error {
	c.Pool, c.Store, c.MySQL, c.DB = nil, nil, nil, nil
	if a.Store != nil {
		c.Pool, c.Store = a.Pool, a.Store
		return nil
	}
	if st, ok := a.Driver.(*mysqlstore.Store); ok {
		c.MySQL = st
		return nil
	}
	kind := "unknown"
	if a.Driver != nil {
		kind = a.Driver.Kind()
	}
	return fmt.Errorf("the demo services keep their orders in PostgreSQL or MySQL; database_url names a %s database", kind)
}

// database returns the demo's database as the config names it.
func (c *Config) database() (database, error) {
	switch {
	case c.MySQL != nil && (c.Pool != nil || c.Store != nil):
		return nil, errors.New("demo config: set Pool and Store (PostgreSQL) or MySQL (MySQL, MariaDB), not both")
	case c.MySQL != nil:
		return &mysqlDB{db: cmp.Or(c.DB, c.MySQL.DB()), store: c.MySQL}, nil
	case c.DB != nil:
		return nil, errors.New("demo config: DB is set without MySQL, the outbox store the orders enqueue their messages with")
	case c.Pool != nil && c.Store != nil:
		return &postgresDB{pool: c.Pool, store: c.Store}, nil
	}
	return nil, errors.New("demo config: set Pool and Store (PostgreSQL) or MySQL (MySQL, MariaDB)")
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

// Start creates the demo tables, binds both listeners and serves until Close.
func Start(ctx context.Context, cfg Config) (*Services, error) {
	cfg.OrdersAddr = cmp.Or(cfg.OrdersAddr, "127.0.0.1:8080")
	cfg.InventoryAddr = cmp.Or(cfg.InventoryAddr, "127.0.0.1:8081")
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if !(cfg.FailRate >= 0 && cfg.FailRate <= 1) { // NaN too
		return nil, fmt.Errorf("demo fail rate must be between 0 and 1, got %g", cfg.FailRate)
	}
	db, err := cfg.database()
	if err != nil {
		return nil, err
	}
	if err := db.createTables(ctx); err != nil {
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
	inv := &inventory{db: db, log: cfg.Logger}
	inv.setFailRate(cfg.FailRate)
	s := &Services{
		OrdersURL:    "http://" + ordersL.Addr().String(),
		InventoryURL: "http://" + inventoryL.Addr().String(),
		done:         make(chan error, 2),
	}
	for _, srv := range []struct {
		l net.Listener
		h http.Handler
	}{{ordersL, (&orders{db: db, teamTopics: cfg.TeamTopics, brokerTopic: cfg.BrokerTopic}).handler()}, {inventoryL, inv.handler()}} {
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
	db          database
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
	var messageID uuid.UUID
	var teamMessages []uuid.UUID
	var brokerMessage uuid.UUID
	orderID, err := o.db.createOrder(r.Context(), req.SKU, req.Qty, func(orderID int64, enqueue enqueueFunc) error {
		payload := orderPayload{OrderID: orderID, SKU: req.SKU, Qty: req.Qty}
		var err error
		if messageID, err = enqueue(store.Message{Topic: TopicOrderCreated}, payload); err != nil {
			return err
		}
		if o.brokerTopic {
			if brokerMessage, err = enqueue(store.Message{Topic: TopicOrderPlaced, OrderingKey: fmt.Sprintf("order-%d", orderID)}, payload); err != nil {
				return err
			}
		}
		if !o.teamTopics {
			return nil
		}
		// The same transaction tells the loyalty and fulfilment teams.
		for _, topic := range []string{TopicOrderPoints, TopicOrderFulfil} {
			id, err := enqueue(store.Message{Topic: topic}, payload)
			if err != nil {
				return err
			}
			teamMessages = append(teamMessages, id)
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
	ord, found, err := o.db.order(r.Context(), id)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	if !found {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such order"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"order_id": id, "sku": ord.SKU, "qty": ord.Qty, "created_at": ord.CreatedAt})
}

type inventory struct {
	db       database
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
	rows, err := inv.db.reserve(r.Context(), reservation{MessageID: key, OrderID: ev.Payload.OrderID, SKU: ev.Payload.SKU, Qty: ev.Payload.Qty})
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	inv.log.InfoContext(r.Context(), "Stock reserved", slog.String("message_id", ev.MessageID), slog.Int64("order_id", ev.Payload.OrderID),
		slog.String("attempt", r.Header.Get("Outbox-Attempt")), slog.Int64("rows", rows))
	writeJSON(w, http.StatusOK, map[string]any{"reserved": true, "message_id": ev.MessageID})
}

// check answers the outbox's check-processed question: 200 if the message was received.
func (inv *inventory) check(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("message_id"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "message_id must be a UUID"})
		return
	}
	received, err := inv.db.reserved(r.Context(), id)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	if !received {
		writeJSON(w, http.StatusNotFound, map[string]any{"processed": false})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"processed": true})
}

// fail sets the share of requests to answer with 503: POST /fail?rate=0.5.
func (inv *inventory) fail(w http.ResponseWriter, r *http.Request) {
	rate, err := strconv.ParseFloat(r.URL.Query().Get("rate"), 64)
	if err != nil || !(rate >= 0 && rate <= 1) { // NaN too
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("rate must be a number from 0 to 1, got %q", r.URL.Query().Get("rate"))})
		return
	}
	inv.setFailRate(rate)
	writeJSON(w, http.StatusOK, map[string]any{"fail_rate": rate})
}

func (inv *inventory) list(w http.ResponseWriter, r *http.Request) {
	out, err := inv.db.reservations(r.Context())
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, out)
}
