package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
)

// startRelayNotified runs a relay for the env that wakes on the table's notifications
// and otherwise polls only every pollInterval, until the test ends. Its listener looks
// once when LISTEN takes effect, so a row committed before that is not missed.
func (e *env) startRelayNotified(t *testing.T, pollInterval time.Duration) {
	t.Helper()
	require.NoError(t, e.store.SetNotify(context.Background(), true))
	r, err := starter.New(e.store, e.pool, e.client, starter.Config{
		TaskQueue: e.taskQueue, Wakeup: starter.WakeupNotify, PollInterval: pollInterval, Lease: 5 * time.Second,
		Policy: e.cfg.Policy, Logger: logger,
	})
	require.NoError(t, err)
	e.run(t, r.Run)
}

func TestDeliverAfter(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	ctx := context.Background()
	e := newEnv(t, ts)

	// A downstream that records when each message arrives.
	type arrival struct {
		messageID string
		at        time.Time
	}
	arrivals := make(chan arrival, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		at := time.Now()
		var body struct {
			MessageID string `json:"message_id"`
		}
		if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		arrivals <- arrival{body.MessageID, at}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	delayed := e.cfg.Topics["order.created"]
	delayed.URL = srv.URL + "/events"
	e.cfg.Topics["order.delayed"] = delayed

	e.startWorker(t)
	// The poll is an hour away: only the NOTIFY and the relay's wake-up at the due time
	// can deliver the message on time. (With wakeup poll, a first pass that ran before the
	// enqueue committed would sleep the whole hour.)
	e.startRelayNotified(t, time.Hour)

	at := time.Now().Add(2 * time.Second)
	id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: "order.delayed", Payload: json.RawMessage(`{"order": 1}`), DeliverAfter: at})
	require.NoError(t, err)

	var got arrival
	select {
	case got = <-arrivals:
	case <-time.After(30 * time.Second):
		t.Fatal("the delayed message was not delivered")
	}
	require.Equal(t, id.String(), got.messageID)
	row, err := e.store.Get(ctx, id)
	require.NoError(t, err)
	require.NotNil(t, row.NextRetryAt)
	require.False(t, got.at.Before(*row.NextRetryAt), "delivered at %s, before its time %s", got.at, row.NextRetryAt)
	require.Less(t, got.at.Sub(at), 3*time.Second, "delivered %s after its time", got.at.Sub(at))
	t.Logf("delivered %s after its time", got.at.Sub(at))

	e.waitStatus(t, id, store.StatusSent)
	require.Empty(t, arrivals, "delivered once")
}
