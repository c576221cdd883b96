package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/starter"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
	"github.com/outbox-go/outbox/workflows"
)

// TestNULInErrors: a downstream that answers with a binary body holding NUL bytes, and a
// Go handler whose error holds one, end in the dead letters with a readable reason. NUL
// used to make every write of the error fail, so the message was never dead-lettered and
// was sent again by every new run, forever.
func TestNULInErrors(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	var requests sync.Map // topic → *atomic.Int32
	binary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Topic string }
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		n, _ := requests.LoadOrStore(body.Topic, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		code := http.StatusUnprocessableEntity
		if body.Topic == "order.binary500" {
			code = http.StatusInternalServerError
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(code)
		_, _ = w.Write([]byte("\x00\x01\x02\xff\xfe binary \x00 body"))
	}))
	t.Cleanup(binary.Close)
	topic := func() config.Topic {
		return config.Topic{Sink: "http", URL: binary.URL + "/events", InitialInterval: config.Duration(50 * time.Millisecond),
			MaxInterval: config.Duration(100 * time.Millisecond), Timeout: config.Duration(5 * time.Second)}
	}
	e.cfg.Topics["order.binary422"] = topic()
	e.cfg.Topics["order.binary500"] = topic()

	reg, err := e.cfg.Registry(nil)
	require.NoError(t, err)
	reg.Handle("order.nul", delivery.HandlerFunc(func(context.Context, delivery.Message) error {
		return delivery.Permanent(errors.New("rejected: field \x00 is not allowed"))
	}))
	e.run(t, func(ctx context.Context) error {
		return worker.Run(ctx, worker.Config{Client: e.client, TaskQueue: e.taskQueue, Deps: worker.Deps{Store: e.store, Handlers: reg, Logger: logger}})
	})
	e.startRelay(t)

	one := 1
	id422 := e.enqueueOrderPlain(t, "order.binary422", nil)
	id500 := e.enqueueOrderPlain(t, "order.binary500", &one) // two attempts
	idNUL := e.enqueueOrderPlain(t, "order.nul", nil)
	for id, want := range map[uuid.UUID]string{
		id422: `HTTP 422: \x00`,
		id500: `gave up after 2 attempts`,
		idNUL: `rejected: field \x00 is not allowed`,
	} {
		e.waitStatus(t, id, store.StatusDead)
		dead, err := e.store.DeadLetters(context.Background(), id)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Contains(t, dead[0].LastError, want)
	}
	count := func(topic string) int32 {
		n, ok := requests.Load(topic)
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}
	require.Equal(t, int32(1), count("order.binary422"), "a 4xx is sent once")
	require.Equal(t, int32(2), count("order.binary500"), "max_retry_times 1 is two attempts, and no new run sends it again")
}

// TestOwnDatabaseOutage: the outbox's own PostgreSQL goes away for 30 seconds while 40
// messages wait between attempts (the downstream fails each message's first two tries).
// Its outage is not the downstream's failure: no attempt is used up for it, nothing is
// dead-lettered, and every message ends sent once the database is back. The topic keeps
// 4 attempts with waits of 1s, 2s, 4s (the defaults before 12 attempts became the
// default), which an outage that used up attempts would exhaust within 8 seconds.
func TestOwnDatabaseOutage(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)

	st, proxy := proxiedStore(t, e)

	// The downstream fails the first two tries of each message.
	var mu sync.Mutex
	tries := map[string]int{}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		tries[key]++
		if tries[key] <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(down.Close)
	e.cfg.Topics = map[string]config.Topic{"order.created": {Sink: "http", URL: down.URL + "/events", MaxAttempts: 4}}
	e.startWorkerWith(t, st)
	e.startRelayWith(t, st, starter.Config{})

	var ids []uuid.UUID
	for range 40 {
		ids = append(ids, e.enqueueOrderPlain(t, "order.created", nil))
	}
	// Every message has failed its first try and waits (1s) for its second.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, id := range ids {
			if tries[id.String()] >= 1 {
				n++
			}
		}
		return n == len(ids)
	}, 60*time.Second, 20*time.Millisecond)

	proxy.down()
	time.Sleep(30 * time.Second) // the outage: a fault of a given length, not a wait for an event
	proxy.up(t)

	for _, id := range ids {
		require.Eventually(t, func() bool { return e.status(t, id) == store.StatusSent }, 3*time.Minute, 100*time.Millisecond,
			"message %s is %s after the database came back", id, e.status(t, id))
	}
	var dead int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.store.Schema()+`.outbox_dead_letters`).Scan(&dead))
	require.Zero(t, dead)
}

// TestCheckFirstOnANewRun: a message whose send reached the downstream but whose
// workflow was lost (deleted here) is handed over again by reconciliation; the new run
// asks check_url before sending, so the downstream gets no second request.
func TestCheckFirstOnANewRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newServer(t)
	e := newEnv(t, ts)
	processed := sync.Map{}
	var posts atomic.Int32
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if r.Method == http.MethodGet {
			if _, ok := processed.Load(strings.TrimPrefix(r.URL.Path, "/events/")); ok {
				w.WriteHeader(http.StatusOK)
				return
			}
			w.WriteHeader(http.StatusNotFound)
			return
		}
		posts.Add(1)
		processed.Store(key, true)
		w.WriteHeader(http.StatusServiceUnavailable) // processed, but answered as if not: a retry follows
	}))
	t.Cleanup(recv.Close)
	e.cfg.Topics["order.slow"] = config.Topic{Sink: "http", URL: recv.URL + "/events", CheckURL: recv.URL + "/events/{message_id}",
		InitialInterval: config.Duration(time.Hour), Timeout: config.Duration(5 * time.Second)}
	e.startWorker(t)
	e.startRelay(t)
	e.startReconciler(t, e.store, time.Second, 200*time.Millisecond)

	id := e.enqueueOrderPlain(t, "order.slow", nil)
	require.Eventually(t, func() bool { return posts.Load() == 1 }, 30*time.Second, 20*time.Millisecond)
	e.waitStatus(t, id, store.StatusDispatched)
	_, err := e.client.WorkflowService().DeleteWorkflowExecution(ctx, &workflowservice.DeleteWorkflowExecutionRequest{
		Namespace:         e.namespace,
		WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: workflows.WorkflowID(id.String())},
	})
	require.NoError(t, err)

	e.waitStatus(t, id, store.StatusSent)
	require.Equal(t, int32(1), posts.Load(), "the new run asked check_url first and did not send again")
}

// TestStartWhileTheDatabaseIsDown: a worker and a relay started while the outbox's
// database does not answer (an outage, a deploy that starts them first) wait for it
// instead of exiting, and deliver once it is back.
func TestStartWhileTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	st, proxy := proxiedStore(t, e)
	proxy.down()
	e.startWorkerWith(t, st)
	e.startRelayWith(t, st, starter.Config{})
	time.Sleep(3 * time.Second) // both try, and wait
	proxy.up(t)
	id := e.enqueueOrderPlain(t, "order.created", nil)
	e.waitStatus(t, id, store.StatusSent)
}
