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
// It imports only the outbox's delivery package (the activity's input), which depends on
// the standard library alone.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"log"
	"os"
	"sync"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/outbox-go/outbox/delivery"
)

// inventory keeps one reservation per message ID; a real team keeps them in its database.
type inventory struct {
	mu       sync.Mutex
	reserved map[string]bool
}

// ReserveStock reserves the stock of an order, once per message ID. A payload it can
// never handle is a non-retryable error: the outbox dead-letters the message at once.
func (inv *inventory) ReserveStock(ctx context.Context, m delivery.Message) error {
	var order struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	if err := json.Unmarshal(m.Payload, &order); err != nil || order.SKU == "" || order.Qty < 1 {
		return temporal.NewNonRetryableApplicationError("the payload is not an order with a sku and a qty", "BadOrder", err)
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if !inv.reserved[m.MessageID] {
		inv.reserved[m.MessageID] = true
		activity.GetLogger(ctx).Info("Stock reserved", "sku", order.SKU, "qty", order.Qty, "message_id", m.MessageID, "attempt", m.Attempt)
	}
	return nil
}

// HasReservation tells the outbox whether ReserveStock already ran for the message, so
// that after a timeout it does not reserve twice.
func (inv *inventory) HasReservation(_ context.Context, m delivery.Message) (bool, error) {
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
	w.RegisterActivityWithOptions(inv.ReserveStock, activity.RegisterOptions{Name: "ReserveStock"})
	w.RegisterActivityWithOptions(inv.HasReservation, activity.RegisterOptions{Name: "HasReservation"})
	if err := w.Run(worker.InterruptCh()); err != nil {
		log.Fatal(err)
	}
}
