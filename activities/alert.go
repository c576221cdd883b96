package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/outbox-go/outbox/internal/httpx"
	"github.com/outbox-go/outbox/internal/redact"
)

// DeadLetterAlert is the JSON body an alert webhook receives for each dead letter.
type DeadLetterAlert struct {
	Event      string    `json:"event"` // "outbox.dead_lettered"
	MessageID  string    `json:"message_id"`
	Topic      string    `json:"topic"`
	Attempts   int       `json:"attempts"`
	Reason     string    `json:"reason"`
	WorkflowID string    `json:"workflow_id"`
	RunID      string    `json:"run_id"`
	At         time.Time `json:"at"`
}

// AlertWebhooks posts dead-letter alerts: to the topic's own URL, else to the global one.
type AlertWebhooks struct {
	Global string
	Topics map[string]string
	Client *http.Client
}

// Send posts alert to the webhook of its topic. It reports an error for a transport
// failure or a non-2xx answer; a topic without a webhook is not an error.
func (w *AlertWebhooks) Send(ctx context.Context, alert DeadLetterAlert) error {
	if w == nil {
		return nil
	}
	url, ok := w.Topics[alert.Topic]
	if !ok {
		url = w.Global
	}
	if url == "" {
		return nil
	}
	body, err := json.Marshal(alert)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	client := w.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", redact.URL(url), httpx.Unwrap(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("POST %s: HTTP %d%s", redact.URL(url), resp.StatusCode, httpx.Snippet(resp.Body))
	}
	return nil
}
