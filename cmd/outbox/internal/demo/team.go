package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
)

// The demo teams' topics and task queues: the loyalty team awards points with an activity
// of its own worker, and the fulfilment team's workflow is started once per order.
const (
	TopicOrderPoints    = "order.points"
	TopicOrderFulfil    = "order.fulfil"
	LoyaltyTaskQueue    = "demo-loyalty"
	FulfilmentTaskQueue = "demo-fulfilment"
)

// TeamTopics returns the config of the demo teams' topics.
func TeamTopics() map[string]config.Topic {
	return map[string]config.Topic{
		TopicOrderPoints: {
			Activity: "AwardPoints", TaskQueue: LoyaltyTaskQueue, CheckActivity: "HasPoints",
			StartToClose: config.Duration(10 * time.Second), ScheduleToStart: config.Duration(time.Minute),
			MaxAttempts: 5, InitialInterval: config.Duration(time.Second), MaxInterval: config.Duration(10 * time.Second),
		},
		TopicOrderFulfil: {
			Workflow: "FulfilOrder", TaskQueue: FulfilmentTaskQueue, WorkflowID: "fulfil-order-{payload.order_id}",
			MaxAttempts: 5, InitialInterval: config.Duration(time.Second), MaxInterval: config.Duration(10 * time.Second),
		},
	}
}

// orderPayload is what the demo's messages carry.
type orderPayload struct {
	OrderID int64  `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

// team is the demo teams' code: what their own workers run.
type team struct {
	log     *slog.Logger
	mu      sync.Mutex
	awarded map[string]bool // message ID → points awarded (a real team keeps this in its database)
}

// AwardPoints is the loyalty team's activity for order.points: a point per item, once per
// message ID.
func (tm *team) AwardPoints(ctx context.Context, m delivery.Message) error {
	var p orderPayload
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		return fmt.Errorf("order.points payload: %w", err)
	}
	tm.mu.Lock()
	tm.awarded[m.MessageID] = true
	tm.mu.Unlock()
	tm.log.InfoContext(ctx, "Points awarded", slog.Int64("order_id", p.OrderID), slog.Int("points", p.Qty), slog.String("message_id", m.MessageID), slog.Int("attempt", m.Attempt))
	return nil
}

// HasPoints answers whether AwardPoints already ran for the message.
func (tm *team) HasPoints(_ context.Context, m delivery.Message) (bool, error) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.awarded[m.MessageID], nil
}

// FulfilOrder is the fulfilment team's workflow, started once per order by order.fulfil:
// it picks, waits for the courier and ships.
func FulfilOrder(ctx workflow.Context, m delivery.Message) (string, error) {
	var p orderPayload
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		return "", fmt.Errorf("order.fulfil payload: %w", err)
	}
	workflow.GetLogger(ctx).Info("Fulfilling order", "order_id", p.OrderID, "sku", p.SKU, "qty", p.Qty)
	if err := workflow.Sleep(ctx, 2*time.Second); err != nil { // the courier
		return "", err
	}
	return fmt.Sprintf("order %d shipped", p.OrderID), nil
}

// StartTeamWorkers starts the demo teams' workers, each on its own task queue, with c. It
// returns what stops them.
func StartTeamWorkers(c client.Client, logger *slog.Logger) (stop func(), err error) {
	tm := &team{log: logger, awarded: map[string]bool{}}
	loyalty := sdkworker.New(c, LoyaltyTaskQueue, sdkworker.Options{})
	loyalty.RegisterActivityWithOptions(tm.AwardPoints, activity.RegisterOptions{Name: "AwardPoints"})
	loyalty.RegisterActivityWithOptions(tm.HasPoints, activity.RegisterOptions{Name: "HasPoints"})
	fulfilment := sdkworker.New(c, FulfilmentTaskQueue, sdkworker.Options{})
	fulfilment.RegisterWorkflowWithOptions(FulfilOrder, workflow.RegisterOptions{Name: "FulfilOrder"})
	if err := loyalty.Start(); err != nil {
		return nil, fmt.Errorf("demo loyalty worker: %w", err)
	}
	if err := fulfilment.Start(); err != nil {
		loyalty.Stop()
		return nil, fmt.Errorf("demo fulfilment worker: %w", err)
	}
	return func() { fulfilment.Stop(); loyalty.Stop() }, nil
}
