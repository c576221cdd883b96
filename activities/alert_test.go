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
		for _, what := range []string{"the dead letter", "a retried activity alerts once"} {
			res, err := a.DeadLetter(ctx, in)
			require.NoError(t, err, what)
			require.False(t, res.AlreadySent, what)
		}
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
	require.Nil(t, (&config.Config{Topics: map[string]config.Topic{"a": {URL: "http://x"}}}).AlertWebhooks(), "nor with topics")
}

// TestAlertWebhookOfEachTopic pins which webhook a topic's dead letters go to: its own,
// else alerts.webhook_url for a listed topic; the default entry's, else
// alerts.webhook_url, for one not listed.
func TestAlertWebhookOfEachTopic(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[string]string{} // topic → the webhook its alert reached
	webhook := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var a activities.DeadLetterAlert
			require.NoError(t, json.NewDecoder(r.Body).Decode(&a))
			mu.Lock()
			got[a.Topic] = name
			mu.Unlock()
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	own, global, unlisted := webhook("own"), webhook("alerts.webhook_url"), webhook("default.alert_webhook")
	for _, tc := range []struct {
		name                    string
		global, defaultsWebhook string
		want                    map[string]string // topic → webhook, "" for none
	}{
		{"GlobalOnly", global, "", map[string]string{"own": "own", "listed": "alerts.webhook_url", "other": "alerts.webhook_url"}},
		{"DefaultOnly", "", unlisted, map[string]string{"own": "own", "listed": "", "other": "default.alert_webhook"}},
		{"Both", global, unlisted, map[string]string{"own": "own", "listed": "alerts.webhook_url", "other": "default.alert_webhook"}},
		{"Neither", "", "", map[string]string{"own": "own", "listed": "", "other": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			webhooks := (&config.Config{
				Alerts:  config.Alerts{WebhookURL: tc.global},
				Default: &config.Topic{URL: "http://fallback", AlertWebhook: tc.defaultsWebhook},
				Topics: map[string]config.Topic{
					"own":    {URL: "http://x", AlertWebhook: own},
					"listed": {URL: "http://x"},
				},
			}).AlertWebhooks()
			mu.Lock()
			clear(got)
			mu.Unlock()
			for topic := range tc.want {
				require.NoError(t, webhooks.Send(context.Background(), activities.DeadLetterAlert{Topic: topic}))
			}
			mu.Lock()
			defer mu.Unlock()
			for topic, want := range tc.want {
				require.Equal(t, want, got[topic], "topic %s", topic)
			}
		})
	}
}

func TestAlertErrorLeavesURLOut(t *testing.T) {
	// Port 1 (tcpmux): nothing listens there. A port freed by closing a listener may be
	// handed to another test's server before the send.
	closed := "http://127.0.0.1:1/hook/T000/B000/s3cr3t-token"
	alertErr := (&activities.AlertWebhooks{Global: closed}).Send(context.Background(), activities.DeadLetterAlert{Topic: "t"})
	require.Error(t, alertErr)
	require.NotContains(t, alertErr.Error(), "s3cr3t")
}
