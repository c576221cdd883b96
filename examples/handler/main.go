// Command handler is a worker with a topic handler written in Go: loyalty.points messages
// are handled by code, every other topic by the sinks in the config file.
//
//	go run ./examples/handler --config outbox.yaml
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
)

// loyaltyPoints adds points for an order. It returns Permanent for a payload it can never
// handle, so the message is dead-lettered at once instead of retried.
func loyaltyPoints(ctx context.Context, d activities.Delivery) error {
	var p struct {
		CustomerID string `json:"customer_id"`
		Points     int    `json:"points"`
	}
	if err := json.Unmarshal(d.Payload, &p); err != nil || p.CustomerID == "" {
		return activities.Permanent(err)
	}
	// Credit p.Points to p.CustomerID, keyed by d.MessageID so a repeat is a no-op.
	slog.InfoContext(ctx, "Points added", "customer_id", p.CustomerID, "points", p.Points, "message_id", d.MessageID)
	return nil
}

func main() {
	configPath := flag.String("config", "", "outbox config file")
	flag.Parse()
	ctx := context.Background()

	cfg, err := config.Load(*configPath)
	if err != nil {
		log.Fatal(err)
	}
	cfg.ApplyEnv(os.LookupEnv)
	c := cfg.WithDefaults()

	pool, err := pgxpool.New(ctx, c.DatabaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := store.New(pool, store.Config{Schema: c.Schema})
	if err != nil {
		log.Fatal(err)
	}
	handlers, err := activities.RegistryFromConfig(&c, nil)
	if err != nil {
		log.Fatal(err)
	}
	handlers.Handle("loyalty.points", activities.HandlerFunc(loyaltyPoints))

	tc, err := client.Dial(client.Options{HostPort: c.Temporal.Address, Namespace: c.Temporal.Namespace})
	if err != nil {
		log.Fatal(err)
	}
	defer tc.Close()

	// An existing worker of the team's: the outbox's workflow and activities join it.
	w := sdkworker.New(tc, c.Temporal.TaskQueue, sdkworker.Options{})
	worker.Register(w, worker.Deps{Store: st, Handlers: handlers})
	if err := w.Run(sdkworker.InterruptCh()); err != nil {
		log.Fatal(err)
	}
}
