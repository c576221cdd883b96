package starter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// recorder stands in for Temporal: it records starts and answers as told, so that these
// tests can put each answer to the relay at the moment they choose. The real server puts
// the same situations to the relay in the end-to-end tests (e2e/relay_temporal_test.go: a
// run already open or paused, a redrive's run, the check-first inputs, a denied start, a
// namespace or search attributes that do not exist, an outage, a start that hangs; an
// early version's poller in e2e/local_first_test.go; a terminated run in
// e2e/reconcile_test.go).
type recorder struct {
	mu       sync.Mutex
	starts   []client.StartWorkflowOptions
	inputs   []workflows.DeliveryInput
	startErr func(id string) error                      // nil = started
	status   map[string]enumspb.WorkflowExecutionStatus // for Describe
	runs     map[string]string                          // the current run ID, for Describe
	started  chan string
}

func newRecorder() *recorder {
	return &recorder{status: map[string]enumspb.WorkflowExecutionStatus{}, runs: map[string]string{}, started: make(chan string, 1000)}
}

func (r *recorder) ExecuteWorkflow(_ context.Context, opts client.StartWorkflowOptions, wf any, args ...any) (client.WorkflowRun, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if wf != workflows.WorkflowType {
		return nil, fmt.Errorf("unexpected workflow %v", wf)
	}
	r.starts = append(r.starts, opts)
	r.inputs = append(r.inputs, args[0].(workflows.DeliveryInput))
	if r.startErr != nil {
		if err := r.startErr(opts.ID); err != nil {
			return nil, err
		}
	}
	r.started <- opts.ID
	return nil, nil
}

func (r *recorder) DescribeWorkflowExecution(_ context.Context, id, _ string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.status[id]
	if !ok {
		return nil, serviceerror.NewNotFound("no such workflow")
	}
	info := &workflowpb.WorkflowExecutionInfo{Status: st}
	if run, ok := r.runs[id]; ok {
		info.Execution = &commonpb.WorkflowExecution{WorkflowId: id, RunId: run}
	}
	return &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: info}, nil
}

func setup(t *testing.T, rec *recorder, cfg starter.Config) (*starter.Relay, *store.Store) {
	t.Helper()
	pool, st := testdb.Schema(t)
	r, err := starter.New(st, pool, rec, cfg)
	require.NoError(t, err)
	return r, st
}

func enqueue(t *testing.T, st *store.Store, topic string, maxRetryTimes *int) uuid.UUID {
	t.Helper()
	id, err := st.Enqueue(context.Background(), st.DB(), store.Message{Topic: topic, Payload: json.RawMessage(`{}`), MaxRetryTimes: maxRetryTimes})
	require.NoError(t, err)
	return id
}

func status(t *testing.T, st *store.Store, id uuid.UUID) store.Status {
	t.Helper()
	row, err := st.Get(context.Background(), id)
	require.NoError(t, err)
	return row.Status
}

func TestRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("KeepsATopicToItsLimitOfMessagesInFlight", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		// An hour between polls: only the waiting rows make the relay claim again.
		r, st := setup(t, rec, starter.Config{TaskQueue: "q", MaxInFlightPerTopic: 3, BatchSize: 4, PollInterval: time.Hour})
		var bulk []uuid.UUID
		for range 10 {
			bulk = append(bulk, enqueue(t, st, "bulk", nil))
		}
		late := enqueue(t, st, "orders", nil)
		// Run claims until nothing is due: three of the backlog, the rest parked, and the
		// other topic's row committed after the backlog.
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		defer func() {
			stop()
			require.NoError(t, <-done)
		}()
		want := []string{"outbox-" + bulk[0].String(), "outbox-" + bulk[1].String(), "outbox-" + bulk[2].String(), "outbox-" + late.String()}
		var got []string
		for range want {
			select {
			case id := <-rec.started:
				got = append(got, id)
			case <-time.After(10 * time.Second):
				t.Fatalf("started %v, want %v", got, want)
			}
		}
		require.ElementsMatch(t, want, got)
		require.Eventually(t, func() bool { return status(t, st, late) == store.StatusDispatched }, 10*time.Second, 10*time.Millisecond)
		select {
		case id := <-rec.started:
			t.Fatalf("started %s beyond the limit", id)
		case <-time.After(300 * time.Millisecond):
		}
		// Two finish: the next two of the backlog follow, oldest first, without a new row
		// or a notification to wake the relay.
		for _, id := range bulk[:2] {
			sent, err := st.RecordSent(ctx, id)
			require.NoError(t, err)
			require.NotNil(t, sent)
		}
		got = nil
		for range 2 {
			select {
			case id := <-rec.started:
				got = append(got, id)
			case <-time.After(10 * time.Second):
				t.Fatalf("started %v once the topic had room, want two", got)
			}
		}
		require.ElementsMatch(t, []string{"outbox-" + bulk[3].String(), "outbox-" + bulk[4].String()}, got)
		for _, id := range bulk[5:] {
			require.Equal(t, store.StatusPending, status(t, st, id))
		}
	})

	t.Run("StartsWithPoliciesAndMarksDispatched", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{
			TaskQueue: "q",
			Policy: func(topic string) workflows.Policy {
				if topic == "slow" {
					return workflows.Policy{MaxAttempts: 7, InitialInterval: time.Minute}
				}
				return workflows.Policy{}
			},
		})
		zero := 0
		a := enqueue(t, st, "slow", nil)
		b := enqueue(t, st, "fast", &zero)
		n, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, store.StatusDispatched, status(t, st, a))
		require.Equal(t, store.StatusDispatched, status(t, st, b))

		require.Len(t, rec.starts, 2)
		byID := map[string]int{}
		for i, o := range rec.starts {
			byID[o.ID] = i
			require.Equal(t, "q", o.TaskQueue)
			require.Equal(t, enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY, o.WorkflowIDReusePolicy)
			require.Equal(t, enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL, o.WorkflowIDConflictPolicy)
			require.True(t, o.WorkflowExecutionErrorWhenAlreadyStarted)
			require.Zero(t, o.WorkflowExecutionTimeout)
			require.Zero(t, o.WorkflowRunTimeout)
			require.Equal(t, 3, o.TypedSearchAttributes.Size())
		}
		inA := rec.inputs[byID["outbox-"+a.String()]]
		require.Equal(t, 7, inA.Policy.MaxAttempts)
		require.Equal(t, time.Minute, inA.Policy.InitialInterval)
		require.True(t, inA.SearchAttributes)
		inB := rec.inputs[byID["outbox-"+b.String()]]
		require.Equal(t, 1, inB.Policy.MaxAttempts, "max_retry_times 0 is one attempt")

		n, err = r.RunOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "dispatched rows are not claimed again")
	})

	// A running run owns the message; so does a paused one (an operator paused it): it is
	// open, and goes on once unpaused.
	for _, running := range []enumspb.WorkflowExecutionStatus{enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, enumspb.WORKFLOW_EXECUTION_STATUS_PAUSED} {
		t.Run("Already"+running.String()+"IsHandedOver", func(t *testing.T) {
			t.Parallel()
			rec := newRecorder()
			r, st := setup(t, rec, starter.Config{})
			id := enqueue(t, st, "t", nil)
			rec.startErr = func(string) error { return serviceerror.NewWorkflowExecutionAlreadyStarted("running", "", "run-1") }
			rec.status["outbox-"+id.String()] = running
			_, err := r.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, store.StatusDispatched, status(t, st, id))
		})
	}

	t.Run("RedrivenBeforeItsDeadLetteringRunClosedIsStartedAgainSoon", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{}) // a 30s lease
		id := enqueue(t, st, "t", nil)
		wid := workflows.WorkflowID(id.String())
		ok, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "t", WorkflowID: wid, RunID: "run-1", Attempts: 1, LastError: "HTTP 400"})
		require.NoError(t, err)
		require.True(t, ok)
		_, err = st.Redrive(ctx, id, "op")
		require.NoError(t, err)

		// run-1 has dead-lettered the message but has not closed yet.
		var closed atomic.Bool
		rec.startErr = func(string) error {
			if closed.Load() {
				return nil
			}
			return serviceerror.NewWorkflowExecutionAlreadyStarted("running", "", "run-1")
		}
		rec.status[wid] = enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
		rec.runs[wid] = "run-1"
		began := time.Now()
		_, err = r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, store.StatusClaimed, status(t, st, id), "the closing run does not own the redriven message")

		// run-1 fails; the next claim starts the new run, long before the lease expires.
		closed.Store(true)
		rec.mu.Lock()
		rec.status[wid] = enumspb.WORKFLOW_EXECUTION_STATUS_FAILED
		rec.mu.Unlock()
		require.Eventually(t, func() bool {
			_, err := r.RunOnce(ctx)
			require.NoError(t, err)
			return status(t, st, id) == store.StatusDispatched
		}, 10*time.Second, 50*time.Millisecond)
		require.Less(t, time.Since(began), 10*time.Second)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Len(t, rec.inputs, 2)
		require.True(t, rec.inputs[1].CheckFirst, "a redriven message asks check-processed first")
	})

	t.Run("RedrivenWithANewRunRunningIsHandedOver", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{})
		id := enqueue(t, st, "t", nil)
		wid := workflows.WorkflowID(id.String())
		_, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "t", WorkflowID: wid, RunID: "run-1", Attempts: 1, LastError: "HTTP 400"})
		require.NoError(t, err)
		_, err = st.Redrive(ctx, id, "op")
		require.NoError(t, err)
		// Another relay started run-2 for the redrive already.
		rec.startErr = func(string) error { return serviceerror.NewWorkflowExecutionAlreadyStarted("running", "", "run-2") }
		rec.status[wid] = enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
		rec.runs[wid] = "run-2"
		_, err = r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, store.StatusDispatched, status(t, st, id))
	})

	t.Run("AlreadyCompletedIsRecordedSent", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{})
		id := enqueue(t, st, "t", nil)
		rec.startErr = func(string) error { return serviceerror.NewWorkflowExecutionAlreadyStarted("completed", "", "run-1") }
		rec.status["outbox-"+id.String()] = enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, store.StatusSent, status(t, st, id))
	})

	t.Run("FailedStartStaysClaimedUntilTheLeaseExpires", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{Lease: time.Second})
		id := enqueue(t, st, "t", nil)
		rec.startErr = func(string) error { return errors.New("frontend unavailable") }
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, store.StatusClaimed, status(t, st, id))
		n, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "the lease holds")

		rec.mu.Lock()
		rec.startErr = nil
		rec.mu.Unlock()
		require.Eventually(t, func() bool {
			_, err := r.RunOnce(ctx)
			require.NoError(t, err)
			return status(t, st, id) == store.StatusDispatched
		}, 10*time.Second, 100*time.Millisecond)
	})

	t.Run("WakesOnNotifyAndStopsOnCancel", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{Wakeup: starter.WakeupNotify, PollInterval: time.Hour})
		require.NoError(t, st.SetNotify(ctx, true))
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()

		// The first pass runs at start; later ones only on a notification, since the
		// poll interval is an hour.
		for i := range 3 {
			id := enqueue(t, st, "t", nil)
			select {
			case got := <-rec.started:
				require.Equal(t, workflows.WorkflowID(id.String()), got, "message %d", i)
			case <-time.After(10 * time.Second):
				t.Fatalf("message %d was not started after its NOTIFY", i)
			}
		}
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("relay did not stop")
		}
	})

	t.Run("SearchAttributesOff", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{NoSearchAttributes: true})
		enqueue(t, st, "t", nil)
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, rec.starts[0].TypedSearchAttributes.Size())
		require.False(t, rec.inputs[0].SearchAttributes)
	})

	t.Run("CheckFirstWhenAnEarlierSendMayHaveHappened", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		r, st := setup(t, rec, starter.Config{})
		fresh := enqueue(t, st, "t", nil)
		failedBefore := enqueue(t, st, "t", nil)
		_, err := st.RecordFailure(ctx, failedBefore, 1, "HTTP 503")
		require.NoError(t, err)
		// A row reconciliation handed back after its run went missing.
		handedBack := enqueue(t, st, "t", nil)
		_, err = st.DB().Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET dispatched_at = now() - interval '1 hour' WHERE message_id = $1`, handedBack)
		require.NoError(t, err)
		redriven := enqueue(t, st, "t", nil)
		_, err = st.DB().Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET redrive_count = 1 WHERE message_id = $1`, redriven)
		require.NoError(t, err)

		_, err = r.RunOnce(ctx)
		require.NoError(t, err)
		require.Len(t, rec.inputs, 4)
		checkFirst := map[string]bool{}
		for _, in := range rec.inputs {
			checkFirst[in.MessageID] = in.CheckFirst
		}
		require.Equal(t, map[string]bool{fresh.String(): false, failedBefore.String(): true, handedBack.String(): true, redriven.String(): true}, checkFirst)
	})

	t.Run("RefusedStartsAreSummarisedAndReported", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		logs := &logBuffer{}
		r, st := setup(t, rec, starter.Config{Lease: time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		for range 20 {
			enqueue(t, st, "t", nil)
		}
		rec.startErr = func(string) error { return serviceerror.NewPermissionDenied("request unauthorized", "") }
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.ErrorContains(t, r.StartsRefused(), "temporal refused all 20 workflow starts of the last pass: request unauthorized")
		require.Equal(t, 1, strings.Count(logs.String(), "Temporal refused every workflow start of this pass"), "one line for the pass:\n%s", logs)
		require.NotContains(t, logs.String(), "Cannot start delivery workflow", "no line per row")

		// Temporal accepts starts again: the relay is ready again.
		rec.mu.Lock()
		rec.startErr = nil
		rec.mu.Unlock()
		require.Eventually(t, func() bool {
			_, err := r.RunOnce(ctx)
			require.NoError(t, err)
			return r.StartsRefused() == nil
		}, 10*time.Second, 100*time.Millisecond)
	})

	t.Run("RefusalEndsWhenAnotherRelayStartedTheRows", func(t *testing.T) {
		t.Parallel()
		// Relay a's starts are refused; once the lease has run out, relay b starts the
		// rows. a, finding nothing to start since, is not left not-ready.
		refusing := newRecorder()
		refusing.startErr = func(string) error { return serviceerror.NewUnavailable("frontend restarting") }
		cfg := starter.Config{Lease: time.Second}
		a, st := setup(t, refusing, cfg)
		id := enqueue(t, st, "t", nil)
		_, err := a.RunOnce(ctx)
		require.NoError(t, err)
		require.Error(t, a.StartsRefused())
		_, err = a.RunOnce(ctx)
		require.NoError(t, err)
		require.Error(t, a.StartsRefused(), "the refused row is still a's, under its lease")

		b, err := starter.New(st, nil, newRecorder(), cfg)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			_, err := b.RunOnce(ctx)
			require.NoError(t, err)
			return status(t, st, id) == store.StatusDispatched
		}, 10*time.Second, 50*time.Millisecond)
		_, err = a.RunOnce(ctx)
		require.NoError(t, err)
		require.NoError(t, a.StartsRefused(), "nothing to start, and the refused rows' lease has run out")
	})

	t.Run("NegativeSweepIntervalIsAnError", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		_, err := starter.New(st, pool, newRecorder(), starter.Config{SweepInterval: -time.Second})
		require.ErrorContains(t, err, "SweepInterval: must be at least 10ms, got -1s")
	})
}

func TestRelayGivesUpOnLastingRefusals(t *testing.T) {
	t.Parallel()
	for name, refusal := range map[string]error{
		"PermissionDenied":       serviceerror.NewPermissionDenied("request unauthorized", ""),
		"NamespaceNotFound":      serviceerror.NewNamespaceNotFound("orders"),
		"SearchAttributeMissing": serviceerror.NewInvalidArgument("search attribute OutboxTopic is not defined"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			rec := newRecorder()
			rec.startErr = func(string) error { return refusal }
			// A refused row is claimed again after its lease.
			r, st := setup(t, rec, starter.Config{PollInterval: 10 * time.Millisecond, Lease: time.Second})
			enqueue(t, st, "t", nil)
			err := r.Run(ctx)
			require.ErrorIs(t, err, refusal)
			require.ErrorContains(t, err, "does not heal by waiting")
			require.NoError(t, ctx.Err(), "Run returned on its own")
		})
	}

	t.Run("UnavailableKeepsTrying", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		rec := newRecorder()
		var refusals atomic.Int32
		rec.startErr = func(string) error {
			if refusals.Add(1) <= 2 {
				return serviceerror.NewUnavailable("frontend restarting")
			}
			return nil
		}
		r, st := setup(t, rec, starter.Config{PollInterval: 10 * time.Millisecond, Lease: time.Second})
		id := enqueue(t, st, "t", nil)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		select {
		case started := <-rec.started:
			require.Equal(t, workflows.WorkflowID(id.String()), started)
		case err := <-done:
			t.Fatalf("Run returned %v while Temporal was only unavailable", err)
		}
		stop()
		require.NoError(t, <-done)
	})
}

// failingAfterClaim is a store whose claims commit and then fail, as a claim does when a
// step after it (the parking of a full topic's rows) fails.
type failingAfterClaim struct {
	*store.Store
}

func (s failingAfterClaim) ClaimBatch(ctx context.Context, limit int, lease time.Duration, rules store.OrderingRules) (store.ClaimResult, error) {
	res, err := s.Store.ClaimBatch(ctx, limit, lease, rules)
	if err != nil {
		return res, err
	}
	return res, errors.New("park the rows of a full topic: connection reset")
}

// The rows of a claim that committed before a later step of it failed are handed over at
// once, not left to wait for their lease; the pass still reports the error.
func TestRelayHandsOverWhatAFailedClaimTook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	rec := newRecorder()
	r, err := starter.New(failingAfterClaim{st}, pool, rec, starter.Config{TaskQueue: "q"})
	require.NoError(t, err)
	id := enqueue(t, st, "orders", nil)
	n, err := r.RunOnce(ctx)
	require.ErrorContains(t, err, "connection reset")
	require.Equal(t, 1, n)
	require.Equal(t, store.StatusDispatched, status(t, st, id))
	require.Len(t, rec.started, 1)
}

// A row a batch had (its lease ran out, or reconciliation handed it over again) gets a run
// of its own that checks first, and is recorded dispatched to that run, with no batch.
func TestRelayRecordsARowABatchHadAsItsOwnRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := newRecorder()
	r, st := setup(t, rec, starter.Config{TaskQueue: "q"})
	id := enqueue(t, st, "clicks", nil)
	_, err := st.DB().Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET batch_id = 'outbox-batch-earlier' WHERE message_id = $1`, id)
	require.NoError(t, err)
	n, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, rec.inputs, 1)
	require.True(t, rec.inputs[0].CheckFirst, "the batch may have sent it")
	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.StatusDispatched, row.Status)
	require.Nil(t, row.BatchID, "its own run has it, not the batch")
}

// The message a team topic's run gets in its input is the message a run would load: with
// its ordering key.
func TestTeamTopicInputCarriesTheOrderingKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := newRecorder()
	team := workflows.Policy{Activity: &workflows.ActivityHandler{Activity: "ReserveStock", TaskQueue: "inventory"}}
	r, st := setup(t, rec, starter.Config{TaskQueue: "q", Policy: func(string) workflows.Policy { return team }})
	res, err := st.EnqueueMessage(ctx, st.DB(), store.Message{Topic: "order.created", OrderingKey: "order-42", Payload: json.RawMessage(`{"order_id": 42}`)})
	require.NoError(t, err)
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Len(t, rec.inputs, 1)
	in := rec.inputs[0]
	require.Equal(t, res.MessageID.String(), in.MessageID)
	require.NotNil(t, in.Message, "the relay read the message with the claim")
	require.Equal(t, "order-42", in.Message.OrderingKey)
	require.Equal(t, "order-42", in.OrderingKey)
}

// A team topic's run gets in its input every payload Enqueue accepted and Temporal can
// carry, however long jsonb prints it; one whose JSON encoding Temporal would refuse, or
// whose headers are over Enqueue's limit, is left out, so that its run's load
// dead-letters it with the reason.
func TestTeamTopicInputPayloadSizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := newRecorder()
	team := workflows.Policy{Activity: &workflows.ActivityHandler{Activity: "ReserveStock", TaskQueue: "inventory"}}
	pool, def := testdb.Schema(t)
	st, err := store.New(pool, store.Config{Schema: def.Schema(), MaxPayloadBytes: store.HardMaxPayloadBytes})
	require.NoError(t, err)
	r, err := starter.New(st, pool, rec, starter.Config{TaskQueue: "q", Policy: func(string) workflows.Policy { return team }})
	require.NoError(t, err)

	fits := (store.HardMaxPayloadBytes - 2) / 6 // markup characters whose encoding fits
	payloads := map[string]string{
		// jsonb prints it half as long again as written, past the store's limit.
		"compact":       "[" + strings.Repeat("1,", store.HardMaxPayloadBytes/2-2) + "1]",
		"markup":        `"` + strings.Repeat("<", fits) + `"`,
		"tooMuchMarkup": `"` + strings.Repeat("<", fits+1) + `"`,
	}
	ids := map[string]string{}
	for name, p := range payloads {
		id, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: json.RawMessage(p)})
		require.NoError(t, err, name)
		ids[id.String()] = name
	}
	// Headers over Enqueue's limit, written by another program: left out too.
	var bigHeaders uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+def.Schema()+`.outbox_messages (topic, payload, headers)
		VALUES ('order.created', '{}', jsonb_build_object('x-blob', repeat('h', $1::int))) RETURNING message_id`, store.MaxHeadersBytes).Scan(&bigHeaders))
	ids[bigHeaders.String()] = "bigHeaders"
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Len(t, rec.inputs, 4)
	carried := map[string]bool{}
	for _, in := range rec.inputs {
		carried[ids[in.MessageID]] = in.Message != nil
	}
	require.Equal(t, map[string]bool{"compact": true, "markup": true, "tooMuchMarkup": false, "bigHeaders": false}, carried)
}

// hanging is a Temporal whose starts hang until their context ends.
type hanging struct {
	*recorder
	entered chan struct{}
}

func (h hanging) ExecuteWorkflow(ctx context.Context, _ client.StartWorkflowOptions, _ any, _ ...any) (client.WorkflowRun, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// A relay stopped while Temporal hangs gives up its starts StopGrace after its stop, not
// at their own timeout: `outbox run` stops its worker after its relay, within the pod's
// grace period. The rows stay claimed for the next claim, and the cut starts are no
// refusal of Temporal's.
func TestRelayStopsWithinItsGraceWhileTemporalHangs(t *testing.T) {
	t.Parallel()
	pool, st := testdb.Schema(t)
	h := hanging{recorder: newRecorder(), entered: make(chan struct{}, 1)}
	r, err := starter.New(st, pool, h, starter.Config{TaskQueue: "q", StartTimeout: 10 * time.Minute, Lease: time.Hour})
	require.NoError(t, err)
	var ids []uuid.UUID
	for range 3 {
		ids = append(ids, enqueue(t, st, "orders", nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-h.entered // a start hangs
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Run still waits for its starts a minute after its stop (StopGrace is 3s)")
	}
	for _, id := range ids {
		require.Equal(t, store.StatusClaimed, status(t, st, id), "left to the next claim")
	}
	require.NoError(t, r.StartsRefused(), "the cut starts are no refusal")
}
