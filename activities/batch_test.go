package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestSendBatch sends one batch through the send-batch activity against a real store:
// the delivered messages are recorded sent in the same call, each failure is reported with
// its kind and recorded on its row, and the rows that are not the batch's to send (sent
// already, another batch's, dead, dispatched to a run of their own, gone) are reported and
// not sent.
func TestSendBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	const batch = "outbox-batch-test"

	var msgs []store.Message
	for i := range 9 {
		msgs = append(msgs, store.Message{Topic: "clicks", Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, i))})
	}
	once := 0
	msgs[0].MaxRetryTimes = &once // one attempt, whatever the topic's
	res, err := st.EnqueueBatch(ctx, pool, msgs)
	require.NoError(t, err)
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.MessageID
	}
	claim, err := st.ClaimBatch(ctx, 100, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, claim.Claimed, 9)
	for i := range claim.Claimed {
		claim.Claimed[i].Batch = batch
	}
	claim.Claimed[5].Batch = "outbox-batch-other"
	claim.Claimed[8].Batch = "" // a run of its own
	_, err = st.MarkDispatchedAll(ctx, claim.Claimed)
	require.NoError(t, err)
	_, err = st.MarkSent(ctx, ids[4]) // its own run delivered it
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'dead' WHERE message_id = $1`, ids[6])
	require.NoError(t, err)

	sent := map[string]int{}
	reg := activities.NewRegistry()
	reg.Handle("clicks", delivery.HandlerFunc(func(_ context.Context, m delivery.Message) error {
		sent[m.MessageID]++ // one goroutine at a time: Concurrency is 1 below
		require.Equal(t, 1, m.Attempt)
		if m.MessageID == ids[0].String() {
			require.Equal(t, 1, m.MaxAttempts, "its row's max_retry_times + 1")
		} else {
			require.Equal(t, 12, m.MaxAttempts, "the topic's")
		}
		switch m.MessageID {
		case ids[1].String():
			return delivery.Retryable(errors.New("HTTP 503"), 2*time.Second)
		case ids[2].String():
			return delivery.Permanent(errors.New("HTTP 400"))
		case ids[3].String():
			return errors.New("connection reset") // unmarked: ambiguous
		}
		return nil
	}))
	a := &activities.Activities{Store: st, Handlers: reg}
	in := workflows.SendBatchInput{Batch: batch, Topic: "clicks", MaxAttempts: 12, Concurrency: 1, SendTimeout: 5 * time.Second}
	for _, id := range append(ids, uuid.New()) {
		in.Messages = append(in.Messages, workflows.BatchMessage{MessageID: id.String()})
	}
	out, err := a.SendBatch(ctx, in)
	require.NoError(t, err)
	require.Len(t, out.Outcomes, 10)
	kinds := make([]string, len(out.Outcomes))
	for i, o := range out.Outcomes {
		require.Equal(t, in.Messages[i].MessageID, o.MessageID)
		kinds[i] = string(o.Outcome) + ":" + o.ErrType
	}
	require.Equal(t, []string{
		"sent:", "failed:" + workflows.ErrTypeRetryable, "failed:" + workflows.ErrTypePermanent, "failed:" + workflows.ErrTypeAmbiguous,
		"already_sent:", "skipped:", "skipped:", "sent:", "skipped:", "failed:" + workflows.ErrTypePermanent,
	}, kinds)
	require.True(t, out.Outcomes[0].Recorded)
	require.True(t, out.Outcomes[7].Recorded)
	require.Equal(t, 2*time.Second, out.Outcomes[1].RetryAfter)
	require.Contains(t, out.Outcomes[5].Note, "outbox-batch-other")
	require.Contains(t, out.Outcomes[6].Note, "dead")
	require.Contains(t, out.Outcomes[8].Note, "a run of its own")
	require.Contains(t, out.Outcomes[9].Error, "is not in the outbox table")

	require.Len(t, sent, 5, "only the batch's own rows were sent: %v", sent)
	for _, i := range []int{4, 5, 6, 8} {
		require.Zero(t, sent[ids[i].String()], "message %d is not the batch's to send", i)
	}
	for i, want := range map[int]store.Status{0: store.StatusSent, 7: store.StatusSent, 1: store.StatusDispatched, 2: store.StatusDispatched} {
		row, err := st.Get(ctx, ids[i])
		require.NoError(t, err)
		require.Equal(t, want, row.Status, "message %d", i)
		if want == store.StatusDispatched {
			require.Equal(t, 1, row.RetryTimes, "the batch's failed attempt is on the row")
			require.True(t, strings.HasPrefix(*row.LastError, "HTTP "), *row.LastError)
		}
	}

	// A batch of another outbox is refused before anything is read.
	in.Deployment = uuid.NewString()
	_, err = a.SendBatch(ctx, in)
	require.ErrorContains(t, err, "belongs to outbox deployment")
}

// A batch whose topic is paused by the time it sends sends nothing: each message goes to
// a run of its own with no attempt used, which waits for the resume.
func TestSendBatchOfAPausedTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	const batch = "outbox-batch-paused"
	res, err := st.EnqueueBatch(ctx, pool, []store.Message{
		{Topic: "clicks", Payload: json.RawMessage(`{"n": 1}`)}, {Topic: "clicks", Payload: json.RawMessage(`{"n": 2}`)},
	})
	require.NoError(t, err)
	claim, err := st.ClaimBatch(ctx, 100, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, claim.Claimed, 2)
	for i := range claim.Claimed {
		claim.Claimed[i].Batch = batch
	}
	_, err = st.MarkDispatchedAll(ctx, claim.Claimed)
	require.NoError(t, err)
	_, _, err = st.PauseTopic(ctx, "clicks", "ops", "maintenance")
	require.NoError(t, err)

	var sent atomic.Int32
	reg := activities.NewRegistry()
	reg.Handle("clicks", delivery.HandlerFunc(func(context.Context, delivery.Message) error { sent.Add(1); return nil }))
	a := &activities.Activities{Store: st, Handlers: reg}
	in := workflows.SendBatchInput{Batch: batch, Topic: "clicks", MaxAttempts: 1, Concurrency: 1, SendTimeout: 5 * time.Second}
	for _, r := range res {
		in.Messages = append(in.Messages, workflows.BatchMessage{MessageID: r.MessageID.String()})
	}
	out, err := a.SendBatch(ctx, in)
	require.NoError(t, err)
	require.Zero(t, sent.Load(), "nothing reaches the paused topic's downstream")
	for _, o := range out.Outcomes {
		require.Equal(t, workflows.BatchFailed, o.Outcome)
		require.Equal(t, workflows.ErrTypeNotAttempted, o.ErrType, "its own run starts afresh")
		require.Contains(t, o.Error, `topic "clicks" is paused`)
	}
	for _, r := range res {
		row, err := st.Get(ctx, r.MessageID)
		require.NoError(t, err)
		require.Zero(t, row.RetryTimes, "no attempt recorded")
		require.Equal(t, store.StatusDispatched, row.Status)
	}
}

// panickingBatch is a batch handler whose publish panics.
type panickingBatch struct{}

func (panickingBatch) Send(context.Context, delivery.Message) error { return nil }
func (panickingBatch) SendBatch(context.Context, []delivery.Message) []error {
	panic("broker client bug")
}

// A batch handler that panics leaves nothing of the batch running: the SDK recovers the
// activity's panic, and the batch's recorder of delivered messages stops with it.
//
// Not parallel: it counts the process's goroutines, which no other test then starts.
func TestSendBatchWhoseHandlerPanics(t *testing.T) {
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	reg := activities.NewRegistry()
	reg.Handle("clicks", panickingBatch{})
	a := &activities.Activities{Store: st, Handlers: reg}
	sendOnce := func(n int) {
		defer func() { require.NotNil(t, recover()) }()
		res, err := st.EnqueueBatch(ctx, pool, []store.Message{{Topic: "clicks", Payload: json.RawMessage(`{}`)}})
		require.NoError(t, err)
		batch := fmt.Sprintf("outbox-batch-panic-%d", n)
		claim, err := st.ClaimBatch(ctx, 100, time.Minute, store.OrderingRules{})
		require.NoError(t, err)
		for i := range claim.Claimed {
			claim.Claimed[i].Batch = batch
		}
		_, err = st.MarkDispatchedAll(ctx, claim.Claimed)
		require.NoError(t, err)
		_, _ = a.SendBatch(ctx, workflows.SendBatchInput{Batch: batch, Topic: "clicks", MaxAttempts: 3, Concurrency: 1, SendTimeout: 5 * time.Second,
			Messages: []workflows.BatchMessage{{MessageID: res[0].MessageID.String()}}})
	}
	sendOnce(0) // the pool's connections, and anything else started once
	before := runtime.NumGoroutine()
	for n := 1; n <= 20; n++ {
		sendOnce(n)
	}
	require.Eventually(t, func() bool { return runtime.NumGoroutine() < before+10 }, 5*time.Second, 50*time.Millisecond,
		"goroutines: %d before, %d after 20 panics", before, runtime.NumGoroutine())
}
