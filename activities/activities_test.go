package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

func TestActivities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setup := func(t *testing.T, status int) (*activities.Activities, *store.Store) {
		t.Helper()
		_, st := testdb.Schema(t)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
		t.Cleanup(srv.Close)
		reg, err := (&config.Config{Topics: map[string]config.Topic{
			"order.created": {Sink: "http", URL: srv.URL},
		}}).Registry(nil)
		require.NoError(t, err)
		return &activities.Activities{Store: st, Handlers: reg}, st
	}
	enqueue := func(t *testing.T, st *store.Store, topic string) string {
		id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: topic, Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return id.String()
	}

	t.Run("UnknownTopicIsPermanentAndRecorded", func(t *testing.T) {
		t.Parallel()
		a, st := setup(t, 200)
		id := enqueue(t, st, "order.shipped")
		err := sendOnce(ctx, a, workflows.SendInput{MessageID: id, Topic: "order.shipped", Attempt: 1, MaxAttempts: 4})
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr)
		require.Equal(t, workflows.ErrTypeUnknownTopic, appErr.Type())
		require.True(t, appErr.NonRetryable())
		require.Contains(t, appErr.Message(), `no handler for topic "order.shipped"`)
		row, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Equal(t, 1, row.RetryTimes)
		require.Contains(t, *row.LastError, "order.shipped")
	})

	t.Run("ServerErrorIsRetryableAndRecorded", func(t *testing.T) {
		t.Parallel()
		a, st := setup(t, 503)
		id := enqueue(t, st, "order.created")
		err := sendOnce(ctx, a, workflows.SendInput{MessageID: id, Topic: "order.created", Attempt: 3, MaxAttempts: 4})
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr)
		require.Equal(t, workflows.ErrTypeRetryable, appErr.Type())
		require.False(t, appErr.NonRetryable())
		row, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Equal(t, 3, row.RetryTimes)
		require.Contains(t, *row.LastError, "HTTP 503")
	})

	t.Run("AcceptedSendRecordsTheRowSent", func(t *testing.T) {
		t.Parallel()
		a, st := setup(t, 200)
		id := enqueue(t, st, "order.created")
		res, err := a.Send(ctx, workflows.SendInput{MessageID: id, Topic: "order.created", Attempt: 1, MaxAttempts: 4})
		require.NoError(t, err)
		require.True(t, res.Recorded, "the send says it recorded the row: the workflow skips mark-sent")
		row, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Equal(t, store.StatusSent, row.Status, "sent when the handler accepted it, before mark-sent")
		require.NotNil(t, row.SentAt)
		require.NoError(t, a.MarkSent(ctx, workflows.MarkSentInput{MessageID: id, Attempts: 1}), "mark-sent confirms it")
		again, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Equal(t, *row.SentAt, *again.SentAt, "mark-sent leaves the recorded time")
	})

	t.Run("SentMessageIsNotSentAgain", func(t *testing.T) {
		t.Parallel()
		a, st := setup(t, 500)
		id := enqueue(t, st, "order.created")
		require.NoError(t, a.MarkSent(ctx, workflows.MarkSentInput{MessageID: id, Attempts: 1}))
		res, err := a.Send(ctx, workflows.SendInput{MessageID: id, Topic: "order.created", Attempt: 1, MaxAttempts: 1})
		require.NoError(t, err, "a 500 would fail it: nothing was sent")
		require.True(t, res.Recorded)
	})

	t.Run("RowStateBeforeTheTopicsHandler", func(t *testing.T) {
		t.Parallel()
		// A worker without the topic's handler (one of an earlier release, in a rolling
		// deploy) leaves a sent row sent, lets a paused topic's row wait, and refuses a
		// dead one as dead: none of them is an attempt of an unknown topic.
		a, st := setup(t, 200)
		sent, paused, dead := enqueue(t, st, "order.shipped"), enqueue(t, st, "order.refunded"), enqueue(t, st, "order.shipped")
		require.NoError(t, a.MarkSent(ctx, workflows.MarkSentInput{MessageID: sent, Attempts: 1}))
		_, _, err := st.PauseTopic(ctx, "order.refunded", "ops", "maintenance")
		require.NoError(t, err)
		_, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: mustUUID(t, dead), Topic: "order.shipped", WorkflowID: "w", RunID: "r", Attempts: 1, LastError: "HTTP 400"})
		require.NoError(t, err)

		res, err := a.Send(ctx, workflows.SendInput{MessageID: sent, Topic: "order.shipped", Attempt: 2, MaxAttempts: 4})
		require.NoError(t, err)
		require.True(t, res.Recorded)
		for id, want := range map[string]string{paused: workflows.ErrTypeTopicPaused, dead: workflows.ErrTypePermanent} {
			_, err = a.Send(ctx, workflows.SendInput{MessageID: id, Topic: "order.shipped", Attempt: 2, MaxAttempts: 4})
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			require.Equal(t, want, appErr.Type(), appErr.Message())
		}
		for _, id := range []string{sent, paused} {
			row, err := st.Get(ctx, mustUUID(t, id))
			require.NoError(t, err)
			require.Zero(t, row.RetryTimes, "no attempt recorded")
			require.Nil(t, row.LastError)
		}
	})

	t.Run("DeadLetterOfASentRowSaysSo", func(t *testing.T) {
		t.Parallel()
		// The last attempt timed out after its send recorded the row sent: no dead letter,
		// and the run learns that the message was delivered.
		a, st := setup(t, 200)
		id := enqueue(t, st, "order.created")
		require.NoError(t, a.MarkSent(ctx, workflows.MarkSentInput{MessageID: id, Attempts: 1}))
		res, err := a.DeadLetter(ctx, workflows.DeadLetterInput{MessageID: id, Topic: "order.created", WorkflowID: "outbox-" + id, RunID: "r", Attempts: 2, LastError: "gave up after 2 attempts: timeout"})
		require.NoError(t, err)
		require.True(t, res.AlreadySent)
		dls, err := st.DeadLetters(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Empty(t, dls)
		row, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Equal(t, store.StatusSent, row.Status)
	})

	t.Run("PausedTopicSendsNothingAndUsesNoAttempt", func(t *testing.T) {
		t.Parallel()
		_, st := setup(t, 200)
		reg := activities.NewRegistry()
		var calls atomic.Int32
		reg.HandleDefault(delivery.HandlerFunc(func(context.Context, delivery.Message) error { calls.Add(1); return nil }))
		a := &activities.Activities{Store: st, Handlers: reg}
		id := enqueue(t, st, "order.created")
		_, _, err := st.PauseTopic(ctx, "order.created", "ops", "maintenance")
		require.NoError(t, err)
		_, err = a.Send(ctx, workflows.SendInput{MessageID: id, Topic: "order.created", Attempt: 2, MaxAttempts: 4})
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr)
		require.Equal(t, workflows.ErrTypeTopicPaused, appErr.Type())
		require.False(t, appErr.NonRetryable())
		require.Contains(t, appErr.Message(), `topic "order.created" is paused`)
		require.Zero(t, calls.Load(), "nothing reaches the handler")
		row, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Zero(t, row.RetryTimes, "no attempt recorded")
		require.Nil(t, row.LastError)

		_, _, err = st.ResumeTopic(ctx, "order.created")
		require.NoError(t, err)
		res, err := a.Send(ctx, workflows.SendInput{MessageID: id, Topic: "order.created", Attempt: 2, MaxAttempts: 4})
		require.NoError(t, err)
		require.True(t, res.Recorded)
		require.EqualValues(t, 1, calls.Load())
	})

	t.Run("TeamTopicLearnsOfThePauseWhenItRecordsAFailure", func(t *testing.T) {
		t.Parallel()
		a, st := setup(t, 200)
		id := enqueue(t, st, "inventory.reserve")
		in := workflows.RecordFailureInput{MessageID: id, Topic: "inventory.reserve", Attempt: 1, Error: "stock service busy", ErrType: workflows.ErrTypeRetryable}
		require.NoError(t, a.RecordFailure(ctx, in))
		loaded, err := a.LoadMessage(ctx, workflows.LoadMessageInput{MessageID: id})
		require.NoError(t, err)
		require.False(t, loaded.Paused)

		_, _, err = st.PauseTopic(ctx, "inventory.reserve", "ops", "")
		require.NoError(t, err)
		in.Attempt = 2
		err = a.RecordFailure(ctx, in)
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr)
		require.Equal(t, workflows.ErrTypeTopicPaused, appErr.Type())
		require.True(t, appErr.NonRetryable())
		row, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Equal(t, 2, row.RetryTimes, "the failure is recorded all the same")
		loaded, err = a.LoadMessage(ctx, workflows.LoadMessageInput{MessageID: id})
		require.NoError(t, err)
		require.True(t, loaded.Paused)
		require.Equal(t, id, loaded.Message.MessageID)
	})

	t.Run("SendsOverTheTopicsCapAreNotMade", func(t *testing.T) {
		t.Parallel()
		_, st := setup(t, 200)
		reg := activities.NewRegistry()
		entered, release := make(chan string, 4), make(chan struct{})
		reg.HandleDefault(delivery.HandlerFunc(func(_ context.Context, m delivery.Message) error {
			entered <- m.Topic
			if m.Topic == "hangs" {
				<-release
			}
			return nil
		}))
		a := &activities.Activities{Store: st, Handlers: reg, MaxSendsPerTopic: 2}
		send := func(topic string) (string, error) {
			id := enqueue(t, st, topic)
			_, err := a.Send(ctx, workflows.SendInput{MessageID: id, Topic: topic, Attempt: 1, MaxAttempts: 4})
			return id, err
		}
		// Two sends of the hanging topic hold its two slots.
		done := make(chan error, 2)
		for range 2 {
			go func() { _, err := send("hangs"); done <- err }()
			require.Equal(t, "hangs", <-entered)
		}
		// A third is not made: a retryable OutboxTopicBusy error, no attempt recorded.
		id, err := send("hangs")
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr)
		require.Equal(t, workflows.ErrTypeTopicBusy, appErr.Type())
		require.False(t, appErr.NonRetryable())
		require.Contains(t, appErr.Message(), `topic "hangs" has 2 sends running on this worker, its limit (worker.max_sends_per_topic)`)
		row, err := st.Get(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Zero(t, row.RetryTimes)
		require.Equal(t, store.StatusPending, row.Status)
		// Another topic is sent meanwhile.
		_, err = send("healthy")
		require.NoError(t, err)
		require.Equal(t, "healthy", <-entered)
		// Once a slot is free, the topic's send is made.
		close(release)
		require.NoError(t, <-done)
		require.NoError(t, <-done)
		_, err = send("hangs")
		require.NoError(t, err)
	})

	t.Run("CheckWithoutCheckURLIsUnsupported", func(t *testing.T) {
		t.Parallel()
		a, st := setup(t, 200)
		id := enqueue(t, st, "order.created")
		res, err := a.CheckProcessed(ctx, workflows.CheckProcessedInput{MessageID: id, Topic: "order.created"})
		require.NoError(t, err)
		require.False(t, res.Supported)
	})

	t.Run("HandlerErrorKindsMapToTypes", func(t *testing.T) {
		t.Parallel()
		_, st := setup(t, 200)
		reg := activities.NewRegistry()
		var next error
		reg.HandleDefault(delivery.HandlerFunc(func(context.Context, delivery.Message) error { return next }))
		a := &activities.Activities{Store: st, Handlers: reg}
		id := enqueue(t, st, "anything")
		for _, tc := range []struct {
			err      error
			typ      string
			nonRetry bool
		}{
			{delivery.Permanent(errors.New("bad")), workflows.ErrTypePermanent, true},
			{delivery.Retryable(errors.New("busy"), 0), workflows.ErrTypeRetryable, false},
			{delivery.Ambiguous(errors.New("reset")), workflows.ErrTypeAmbiguous, false},
			{errors.New("unclassified"), workflows.ErrTypeAmbiguous, false},
		} {
			next = tc.err
			err := sendOnce(ctx, a, workflows.SendInput{MessageID: id, Topic: "anything", Attempt: 1, MaxAttempts: 2})
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			require.Equal(t, tc.typ, appErr.Type())
			require.Equal(t, tc.nonRetry, appErr.NonRetryable())
		}
	})
}

func mustUUID(t *testing.T, s string) uuid.UUID {
	t.Helper()
	id, err := uuid.Parse(s)
	require.NoError(t, err)
	return id
}

// A send or check of another deployment's message is refused before this worker's
// tables are read: a retryable OutboxWrongDeployment error, nothing recorded on a row of
// this database, and no request to the downstream.
func TestWrongDeployment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, st := testdb.Schema(t)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { requests.Add(1) }))
	t.Cleanup(srv.Close)
	reg, err := (&config.Config{Topics: map[string]config.Topic{"order.created": {Sink: "http", URL: srv.URL}}}).Registry(nil)
	require.NoError(t, err)
	a := &activities.Activities{Store: st, Handlers: reg}
	own, err := st.DeploymentID(ctx)
	require.NoError(t, err)
	id, err := st.Enqueue(ctx, st.DB(), store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	other := uuid.NewString()

	err = sendOnce(ctx, a, workflows.SendInput{MessageID: id.String(), Topic: "order.created", Attempt: 1, MaxAttempts: 1, Deployment: other})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, workflows.ErrTypeWrongDeployment, appErr.Type())
	require.False(t, appErr.NonRetryable())
	require.Contains(t, appErr.Message(), other)
	require.Contains(t, appErr.Message(), "a task queue belongs to one outbox database")
	_, err = a.CheckProcessed(ctx, workflows.CheckProcessedInput{MessageID: id.String(), Topic: "order.created", Deployment: other})
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, workflows.ErrTypeWrongDeployment, appErr.Type())
	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Zero(t, row.RetryTimes, "nothing recorded on this database's row")
	require.Zero(t, requests.Load())

	// Its own deployment, and no deployment at all (a run of an older relay), are sent.
	require.NoError(t, sendOnce(ctx, a, workflows.SendInput{MessageID: id.String(), Topic: "order.created", Attempt: 1, MaxAttempts: 1, Deployment: own.String()}))
	require.NoError(t, sendOnce(ctx, a, workflows.SendInput{MessageID: id.String(), Topic: "order.created", Attempt: 1, MaxAttempts: 1}))
	require.EqualValues(t, 1, requests.Load(), "the second send finds the row sent")
}

// sendOnce runs one send attempt and returns its error.
func sendOnce(ctx context.Context, a *activities.Activities, in workflows.SendInput) error {
	_, err := a.Send(ctx, in)
	return err
}
