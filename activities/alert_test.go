package activities_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

func TestDeadLetterAlert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		mu     sync.Mutex
		alerts []activities.DeadLetterAlert
		paths  []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a activities.DeadLetterAlert
		require.NoError(t, json.NewDecoder(r.Body).Decode(&a))
		mu.Lock()
		alerts = append(alerts, a)
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/broken" {
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	_, st := testdb.Schema(t)
	webhooks := (&config.Config{
		Alerts: config.Alerts{WebhookURL: srv.URL + "/global"},
		Topics: map[string]config.Topic{
			"order.paid":   {URL: "http://x", AlertWebhook: srv.URL + "/payments"},
			"order.broken": {URL: "http://x", AlertWebhook: srv.URL + "/broken"},
		},
	}).AlertWebhooks()
	a := &activities.Activities{Store: st, Handlers: activities.NewRegistry(), Alerts: webhooks}

	deadLetter := func(topic string) string {
		id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: topic, Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		in := workflows.DeadLetterInput{MessageID: id.String(), Topic: topic, WorkflowID: "outbox-" + id.String(), RunID: "run-1", Attempts: 4, LastError: "gave up after 4 attempts: HTTP 500"}
		require.NoError(t, a.DeadLetter(ctx, in))
		require.NoError(t, a.DeadLetter(ctx, in), "a retried activity alerts once")
		return id.String()
	}
	created := deadLetter("order.created")
	paid := deadLetter("order.paid")
	deadLetter("order.broken") // a failing webhook does not fail the activity

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"/global", "/payments", "/broken"}, paths)
	require.Equal(t, created, alerts[0].MessageID)
	require.Equal(t, "outbox.dead_lettered", alerts[0].Event)
	require.Equal(t, 4, alerts[0].Attempts)
	require.Equal(t, "gave up after 4 attempts: HTTP 500", alerts[0].Reason)
	require.Equal(t, paid, alerts[1].MessageID)

	require.Nil(t, (&config.Config{}).AlertWebhooks(), "no webhook configured")
}

func TestAlertErrorLeavesURLOut(t *testing.T) {
	// Port 1 (tcpmux): nothing listens there. A port freed by closing a listener may be
	// handed to another test's server before the send.
	closed := "http://127.0.0.1:1/hook/T000/B000/s3cr3t-token"
	alertErr := (&activities.AlertWebhooks{Global: closed}).Send(context.Background(), activities.DeadLetterAlert{Topic: "t"})
	require.Error(t, alertErr)
	require.NotContains(t, alertErr.Error(), "s3cr3t")
}
