// Command handler is a team's worker with a topic handler written in Go: loyalty.points
// messages are handled by code, every other topic by the sinks in the config file. It gets
// everything outbox worker gets from the same file (the Temporal connection with its TLS,
// API key and codec, the search-attribute check, the topics' policies, alert webhooks,
// metrics and readiness, the retention schedule) and adds the outbox to a worker of its own.
//
//	go run ./examples/handler --config outbox.yaml
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"

	sdkworker "go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/worker"
)

// loyaltyPoints adds points for an order. It returns Permanent for a payload it can never
// handle, so the message is dead-lettered at once instead of retried.
func loyaltyPoints(ctx context.Context, d delivery.Message) error {
	var p struct {
		CustomerID string `json:"customer_id"`
		Points     int    `json:"points"`
	}
	if err := json.Unmarshal(d.Payload, &p); err != nil {
		return delivery.Permanent(fmt.Errorf("not a points payload: %w", err))
	}
	if p.CustomerID == "" {
		return delivery.Permanent(errors.New("not a points payload: customer_id is missing"))
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
	a, err := app.Connect(ctx, cfg, app.Options{Logger: slog.Default()})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	deps, err := a.PrepareWorker(ctx, app.Handlers{Topics: map[string]delivery.Handler{
		"loyalty.points": delivery.HandlerFunc(loyaltyPoints),
	}})
	if err != nil {
		log.Fatal(err)
	}

	// The team's worker: the outbox's workflow and activities join it.
	// worker.Options names the outbox's workflow version and deployment in its identity,
	// which the relays and other outbox deployments read.
	w := sdkworker.New(a.Temporal, a.Config.Temporal.TaskQueue, worker.Options(a.Config.Worker.WorkerOptions(), deps))
	worker.Register(w, deps)
	if err := w.Run(sdkworker.InterruptCh()); err != nil {
		log.Fatal(err)
	}
}
