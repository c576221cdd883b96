// Package outboxtest helps a team test its outbox code against a real PostgreSQL and its
// topic handlers against OutboxDelivery, without a Temporal server:
//
//	func TestPlaceOrder(t *testing.T) {
//		pool, st := outboxtest.Schema(t, "")
//		placeOrder(t, pool, st, 42) // the code under test: an order and its message in one transaction
//		msg := outboxtest.RequireEnqueued(t, pool, st, "order.created", func(o Order) bool { return o.ID == 42 })
//		res, err := outboxtest.Deliver(t, st, msg.MessageID, workflows.Policy{Activity: &workflows.ActivityHandler{
//			Activity: "ReserveStock", TaskQueue: "inventory"}}, func(r outboxtest.Registry) {
//			r.RegisterActivityWithOptions(ReserveStock, activity.RegisterOptions{Name: "ReserveStock"})
//		})
//		...
//	}
package outboxtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// DefaultURL is the database Schema uses when neither its url nor TEST_DATABASE_URL is
// set: a local PostgreSQL with trust authentication.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Schema connects to url (TEST_DATABASE_URL, then DefaultURL, when empty), creates a
// schema of the test's own with the outbox tables in it, and drops it and closes the pool
// when the test ends. Business tables the test creates in the pool's search path land in
// the database's default schema; name the schema (st.Schema()) to keep them in the test's.
func Schema(t testing.TB, url string) (*pgxpool.Pool, *store.Store) {
	t.Helper()
	url = cmp.Or(url, os.Getenv("TEST_DATABASE_URL"), DefaultURL)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("outboxtest: connect to %s: %v", url, err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("outboxtest: PostgreSQL at %s does not answer (set TEST_DATABASE_URL): %v", url, err)
	}
	schema := fmt.Sprintf("outbox_test_%08x", rand.Uint32())
	st, err := store.New(pool, store.Config{Schema: schema})
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Errorf("outboxtest: drop test schema %s: %v", schema, err)
		}
	})
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatalf("outboxtest: migrate schema %s: %v", schema, err)
	}
	return pool, st
}

// Message is an enqueued message as a test sees it.
type Message struct {
	MessageID uuid.UUID
	Topic     string
	Payload   json.RawMessage
	Headers   map[string]string
}

// Enqueued returns the messages of topic in st's table, oldest first, as db sees them: a
// transaction (a pgx.Tx, or a database/sql one through store.SQLTx) sees its own
// uncommitted messages, a pool the committed ones.
func Enqueued(t testing.TB, db store.DB, st *store.Store, topic string) []Message {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT message_id, topic, payload::text, coalesce(headers, '{}')::text FROM `+
		pgx.Identifier{st.Schema(), "outbox_messages"}.Sanitize()+` WHERE topic = $1 ORDER BY id`, topic)
	if err != nil {
		t.Fatalf("outboxtest: read the %s messages: %v", topic, err)
	}
	var out []Message
	var m Message
	var payload, headers string // text, which pgx and database/sql both scan
	if _, err := pgx.ForEachRow(rows, []any{&m.MessageID, &m.Topic, &payload, &headers}, func() error {
		m.Payload = json.RawMessage(payload)
		if m.Headers = store.ParseHeaders([]byte(headers)); m.Headers == nil {
			m.Headers = map[string]string{}
		}
		out = append(out, m)
		m = Message{}
		return nil
	}); err != nil {
		t.Fatalf("outboxtest: read the %s messages: %v", topic, err)
	}
	return out
}

// RequireEnqueued fails the test unless db sees a message of topic whose payload decodes
// into a T for which match returns true (a nil match accepts any); it returns the first
// such message.
func RequireEnqueued[T any](t testing.TB, db store.DB, st *store.Store, topic string, match func(T) bool) Message {
	t.Helper()
	msgs := Enqueued(t, db, st, topic)
	var problems []error
	for _, m := range msgs {
		var v T
		if err := json.Unmarshal(m.Payload, &v); err != nil {
			problems = append(problems, fmt.Errorf("message %s: payload does not decode into %T: %w", m.MessageID, v, err))
			continue
		}
		if match == nil || match(v) {
			return m
		}
		problems = append(problems, fmt.Errorf("message %s: payload %s does not match", m.MessageID, m.Payload))
	}
	t.Fatalf("outboxtest: no %s message matches (%d enqueued)\n%v", topic, len(msgs), errors.Join(problems...))
	return Message{}
}

// RequireNotEnqueued fails the test when db sees a message of topic.
func RequireNotEnqueued(t testing.TB, db store.DB, st *store.Store, topic string) {
	t.Helper()
	if msgs := Enqueued(t, db, st, topic); len(msgs) > 0 {
		t.Fatalf("outboxtest: %d %s message(s) enqueued, want none; the first: %s %s", len(msgs), topic, msgs[0].MessageID, msgs[0].Payload)
	}
}

// Registry is where Deliver's register adds the team's activities and workflows.
type Registry interface {
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
}

// Deliver runs one message through OutboxDelivery in the Temporal SDK's test environment
// (no server; waits are skipped): the outbox's own activities on st, and the team's
// activities and workflows that register adds, under policy (the topic's Activity or
// Workflow handler and its attempts). It returns the delivery's result or the error it
// failed with (a dead-lettered message fails with a workflows.ErrTypeDeadLettered error);
// the row's status is in st afterwards.
//
// A workflow topic with a signal, and a Nexus topic, need a Temporal server (signal-with-
// start and Nexus endpoints are not in the test environment): Deliver returns an error
// for them and leaves the row as it is. Run those against a dev server (temporal server
// start-dev, or outbox dev) with app.Run.
func Deliver(t testing.TB, st *store.Store, messageID uuid.UUID, policy workflows.Policy, register func(Registry)) (workflows.DeliveryResult, error) {
	t.Helper()
	switch {
	case policy.Workflow != nil && policy.Workflow.Signal != "":
		return workflows.DeliveryResult{}, fmt.Errorf("outboxtest: Deliver cannot run a workflow topic with a signal (workflow %s, signal %s): signal-with-start needs a Temporal server; test the team's workflow with the SDK's test suite, and the topic against a dev server",
			policy.Workflow.Workflow, policy.Workflow.Signal)
	case policy.Nexus != nil:
		return workflows.DeliveryResult{}, errors.New("outboxtest: Deliver cannot run a Nexus topic: Nexus endpoints need a Temporal server; test the topic against a dev server")
	}
	row, err := st.Get(context.Background(), messageID)
	if err != nil {
		t.Fatalf("outboxtest: message %s: %v", messageID, err)
	}
	var suite testsuite.WorkflowTestSuite
	// The SDK's test environment logs to standard output unless given a logger: its
	// warnings and errors go to the test's log instead, shown when the test fails or runs
	// with -v.
	suite.SetLogger(sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	env := suite.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
	(&activities.Activities{Store: st, Handlers: activities.NewRegistry()}).Register(env)
	if register != nil {
		register(env)
	}
	env.ExecuteWorkflow(workflows.WorkflowType, workflows.DeliveryInput{
		MessageID: messageID.String(), Topic: row.Topic,
		Policy:  workflows.ResolvePolicy(policy, row.MaxRetryTimes),
		Version: workflows.DeliveryVersion,
	})
	if !env.IsWorkflowCompleted() {
		t.Fatalf("outboxtest: the delivery of %s did not complete", messageID)
	}
	var res workflows.DeliveryResult
	if err := env.GetWorkflowError(); err != nil {
		return res, err
	}
	return res, env.GetWorkflowResult(&res)
}

// testLog writes log lines to a test's log.
type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}
