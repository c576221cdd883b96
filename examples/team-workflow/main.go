// Command team-workflow is a team's own worker whose workflow an outbox topic starts,
// once per order, exactly when the order's transaction commits. The outbox's config:
//
//	topics:
//	  order.created:
//	    workflow: FulfilOrder
//	    task_queue: fulfilment
//	    workflow_id: "fulfil-{payload.order_id}"
//
//	TEMPORAL_ADDRESS=127.0.0.1:7233 go run ./examples/team-workflow
package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/delivery"
)

// FulfilOrder fulfils one order. Its ID (fulfil-<order_id>) makes it the order's only
// fulfilment, however often the message is delivered.
func FulfilOrder(ctx workflow.Context, m delivery.Message) (string, error) {
	var order struct {
		OrderID int64  `json:"order_id"`
		SKU     string `json:"sku"`
		Qty     int    `json:"qty"`
	}
	if err := json.Unmarshal(m.Payload, &order); err != nil {
		return "", temporal.NewNonRetryableApplicationError("the payload is not an order", "BadOrder", err)
	}
	workflow.GetLogger(ctx).Info("Fulfilling order", "order_id", order.OrderID, "sku", order.SKU, "qty", order.Qty)
	// Pick, pack, hand to the courier: activities of the team's, here a timer.
	if err := workflow.Sleep(ctx, 5*time.Second); err != nil {
		return "", err
	}
	return fmt.Sprintf("order %d shipped", order.OrderID), nil
}

func main() {
	c, err := client.Dial(client.Options{HostPort: cmp.Or(os.Getenv("TEMPORAL_ADDRESS"), client.DefaultHostPort)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	w := worker.New(c, "fulfilment", worker.Options{})
	w.RegisterWorkflowWithOptions(FulfilOrder, workflow.RegisterOptions{Name: "FulfilOrder"})
	if err := w.Run(worker.InterruptCh()); err != nil {
		log.Fatal(err)
	}
}
