package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store"
)

// What outbox show says a message waits for, and when it shows a next attempt: a batch
// run already started goes on in a pause, and only a message not yet handed over has a
// "deliver not before" time to show.
func TestShowSaysWhatAMessageWaitsFor(t *testing.T) {
	at := time.Now().Add(time.Hour)
	now := time.Now()
	view := func(status store.Status, batch bool) *messageView {
		v := &messageView{MessageID: uuid.New(), Topic: "clicks", Status: status, Paused: true, NextRetryAt: &at, CreatedAt: &now}
		if batch {
			v.Batch = &batchView{WorkflowID: "outbox-batch-1"}
		}
		return v
	}
	require.Equal(t, ", topic paused: waits for outbox topic resume clicks", view(store.StatusPending, false).waitsFor())
	require.Equal(t, ", topic paused: waits for outbox topic resume clicks", view(store.StatusDispatched, false).waitsFor())
	require.Empty(t, view(store.StatusDispatched, true).waitsFor(), "its batch sends it")
	handedOver := view(store.StatusDispatched, true)
	handedOver.Runs = []runView{{WorkflowID: "outbox-" + handedOver.MessageID.String(), Status: "Running"}}
	require.Equal(t, ", topic paused: waits for outbox topic resume clicks", handedOver.waitsFor(), "its batch handed it to a run of its own")

	for status, shown := range map[store.Status]bool{
		store.StatusPending: true, store.StatusClaimed: true,
		store.StatusDispatched: false, store.StatusDead: false, store.StatusDiscarded: false, store.StatusSent: false,
	} {
		var b bytes.Buffer
		view(status, false).write(&b)
		require.Equal(t, shown, bytes.Contains(b.Bytes(), []byte("Next attempt")), "status %s", status)
	}
}
