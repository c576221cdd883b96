package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/outbox-go/outbox/delivery"
)

// A team's topic handler classifies each failure, which decides what the delivery
// workflow does next: Permanent dead-letters the message at once, Retryable sends again
// after a wait, and Ambiguous (also any error left unmarked) asks the handler's Checker,
// if it has one, whether the downstream already has the message before sending again.
func ExampleHandlerFunc() {
	// The stock service's answers by order ID; a real handler makes a request here.
	answers := map[int]int{1: http.StatusOK, 2: http.StatusUnprocessableEntity, 3: http.StatusTooManyRequests, 4: http.StatusGatewayTimeout}

	reserveStock := delivery.HandlerFunc(func(ctx context.Context, d delivery.Message) error {
		var order struct {
			ID int `json:"order_id"`
		}
		if err := json.Unmarshal(d.Payload, &order); err != nil || order.ID == 0 {
			return delivery.Permanent(fmt.Errorf("not an order: %s", d.Payload)) // no retry fixes it
		}
		// Send the request with d.MessageID as its idempotency key, then look at the answer.
		switch status := answers[order.ID]; {
		case status < 300:
			return nil // the stock service has the reservation
		case status == http.StatusTooManyRequests:
			return delivery.Retryable(errors.New("stock service busy"), 30*time.Second) // not processed
		case status < 500:
			return delivery.Permanent(fmt.Errorf("stock service refused order %d: %d", order.ID, status))
		default:
			return delivery.Ambiguous(fmt.Errorf("stock service: %d", status)) // it may have the order
		}
	})

	for _, payload := range []string{`{"order_id": 1}`, `{"order_id": 2}`, `{"order_id": 3}`, `{"order_id": 4}`, `{}`} {
		err := reserveStock.Send(context.Background(), delivery.Message{Topic: "order.created", Payload: json.RawMessage(payload), Attempt: 1})
		retryAfter, retryable := delivery.IsRetryable(err)
		fmt.Printf("%s: error=%v permanent=%t retryable=%t/%s ambiguous=%t\n",
			payload, err, delivery.IsPermanent(err), retryable, retryAfter, delivery.IsAmbiguous(err))
	}
	// Output:
	// {"order_id": 1}: error=<nil> permanent=false retryable=false/0s ambiguous=false
	// {"order_id": 2}: error=stock service refused order 2: 422 permanent=true retryable=false/0s ambiguous=false
	// {"order_id": 3}: error=stock service busy permanent=false retryable=true/30s ambiguous=false
	// {"order_id": 4}: error=stock service: 504 permanent=false retryable=false/0s ambiguous=true
	// {}: error=not an order: {} permanent=true retryable=false/0s ambiguous=false
}
