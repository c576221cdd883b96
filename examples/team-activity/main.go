// Command team-activity is a team's own worker that serves an outbox topic with an
// activity, on the team's own task queue. The outbox's config routes the topic to it:
//
//	topics:
//	  inventory.reserve:
//	    activity: ReserveStock
//	    task_queue: inventory
//	    check_activity: HasReservation
//
//	TEMPORAL_ADDRESS=127.0.0.1:7233 go run ./examples/team-activity
//
// The activity is a delivery.Handler, the same contract as a handler compiled into the
// outbox's worker: teamactivity.Activity registers it, and its errors (delivery.Permanent,
// Retryable, Ambiguous) reach the outbox as they would from there. It imports only the
// outbox's delivery package (standard library only) and sinks/teamactivity (the Temporal
// SDK besides).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamactivity"
)

// inventory keeps one reservation per message ID; a real team keeps them in its database.
type inventory struct {
	mu       sync.Mutex
	reserved map[string]bool
}

// Send reserves the stock of an order, once per message ID. A payload it can never
// handle is a permanent failure: the outbox dead-letters the message at once.
func (inv *inventory) Send(ctx context.Context, m delivery.Message) error {
	var order struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	if err := json.Unmarshal(m.Payload, &order); err != nil || order.SKU == "" || order.Qty < 1 {
		return delivery.Permanent(fmt.Errorf("the payload is not an order with a sku and a qty: %s", m.Payload))
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if !inv.reserved[m.MessageID] {
		inv.reserved[m.MessageID] = true
		activity.GetLogger(ctx).Info("Stock reserved", "sku", order.SKU, "qty", order.Qty, "message_id", m.MessageID, "attempt", m.Attempt)
	}
	return nil
}

// CheckProcessed tells the outbox whether the stock of the message is reserved already,
// so that after a timeout it does not reserve twice.
func (inv *inventory) CheckProcessed(_ context.Context, m delivery.Message) (bool, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.reserved[m.MessageID], nil
}

func main() {
	c, err := client.Dial(client.Options{HostPort: cmp.Or(os.Getenv("TEMPORAL_ADDRESS"), client.DefaultHostPort)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	inv := &inventory{reserved: map[string]bool{}}
	w := worker.New(c, "inventory", worker.Options{})
	w.RegisterActivityWithOptions(teamactivity.Activity(inv), activity.RegisterOptions{Name: "ReserveStock"})
	w.RegisterActivityWithOptions(teamactivity.CheckActivity(inv), activity.RegisterOptions{Name: "HasReservation"})
	if err := w.Run(worker.InterruptCh()); err != nil {
		log.Fatal(err)
	}
}
