package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// Run runs the conformance suite against the targets h makes. Each case is a subtest with
// a target of its own, and the cases run in parallel with each other.
//
// The suite drives the store only through storedriver.Driver and the Target's InTx and
// InsertSQL. It uses Exec for two statements (see ShiftSQL and RestoreSQL), in the
// target's Dialect.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.New, "storetest: Harness.New is nil")
	for _, c := range []struct {
		name string
		run  func(t *testing.T, h Harness)
	}{
		{"Enqueue", testEnqueue},
		{"IdempotencyKey", testIdempotencyKey},
		{"Claim", testClaim},
		{"Ordering", testOrdering},
		{"DeliverAfter", testDeliverAfter},
		{"Transitions", testTransitions},
		{"Retention", testRetention},
		{"StatsAndBacklog", testStatsAndBacklog},
		{"PlainSQLRows", testPlainSQLRows},
		{"Deployment", testDeployment},
		{"PublishedPolicy", testPublishedPolicy},
		{"Pause", testPause},
		{"InFlightLimit", testInFlightLimit},
		{"Migrate", testMigrate},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, h)
		})
	}
}

// ShiftSQL, per dialect, moves one timestamp column of one outbox_messages row (by id)
// two days into the past; %[1]s is the column: lease_until, next_retry_at, sent_at or
// updated_at. The suite uses it to end a lease, make a delayed row due, age a sent,
// discarded or dispatched row. It shifts rather than sets a time, so the database's and
// the session's time zones do not matter.
var ShiftSQL = map[string]string{
	"postgres": `UPDATE outbox_messages SET %[1]s = %[1]s - interval '2 days' WHERE id = $1`,
	"mysql":    `UPDATE outbox_messages SET %[1]s = %[1]s - INTERVAL 2 DAY WHERE id = ?`,
}

// sentByHandSQL, per dialect, marks one message (by id) sent as an operator might by
// hand: without a sent_at.
var sentByHandSQL = map[string]string{
	"postgres": `UPDATE outbox_messages SET status = 'sent', sent_at = NULL WHERE id = $1`,
	"mysql":    `UPDATE outbox_messages SET status = 'sent', sent_at = NULL WHERE id = ?`,
}

// RestoreSQL, per dialect, copies one archived message (by id) back into
// outbox_messages, so that the suite reads what the archive holds through Get.
var RestoreSQL = map[string]string{
	"postgres": `INSERT INTO outbox_messages (id, message_id, topic, payload, status)
SELECT id, message_id, topic, payload, status FROM outbox_messages_archive WHERE id = $1`,
	"mysql": `INSERT INTO outbox_messages (id, message_id, topic, payload, status)
SELECT id, message_id, topic, payload, status FROM outbox_messages_archive WHERE id = ?`,
}

// env is one case's target with the helpers the cases share.
type env struct {
	t   *testing.T
	ctx context.Context
	Target
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	tg := h.New(t)
	require.NotNil(t, tg.Driver, "storetest: Target.Driver is nil")
	require.Contains(t, []string{"postgres", "mysql"}, tg.Dialect, "storetest: Target.Dialect")
	return &env{t: t, ctx: t.Context(), Target: tg}
}

func (e *env) d() storedriver.Driver { return e.Driver }

func msg(topic, payload string) storedriver.Message {
	return storedriver.Message{Topic: topic, Payload: json.RawMessage(payload)}
}

func keyed(topic, key string, n int) storedriver.Message {
	return storedriver.Message{Topic: topic, OrderingKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n))}
}

// enqueue enqueues msgs in one committed transaction.
func (e *env) enqueue(msgs ...storedriver.Message) []storedriver.Enqueued {
	e.t.Helper()
	out := make([]storedriver.Enqueued, 0, len(msgs))
	err := e.InTx(e.ctx, func(enqueue Enqueue) error {
		for _, m := range msgs {
			res, err := enqueue(e.ctx, m)
			if err != nil {
				return err
			}
			out = append(out, res)
		}
		return nil
	})
	require.NoError(e.t, err)
	return out
}

// enqueueOne enqueues one message in its own transaction and returns its ID.
func (e *env) enqueueOne(m storedriver.Message) uuid.UUID {
	e.t.Helper()
	return e.enqueue(m)[0].MessageID
}

func (e *env) get(id uuid.UUID) storedriver.Row {
	e.t.Helper()
	row, err := e.d().Get(e.ctx, id)
	require.NoError(e.t, err, "get %s", id)
	return row
}

func (e *env) requireNotFound(id uuid.UUID) {
	e.t.Helper()
	_, err := e.d().Get(e.ctx, id)
	require.ErrorIs(e.t, err, storedriver.ErrNotFound, "message %s", id)
}

func (e *env) status(id uuid.UUID) storedriver.Status {
	e.t.Helper()
	return e.get(id).Status
}

func (e *env) claim(limit int, rules storedriver.OrderingRules) storedriver.ClaimResult {
	e.t.Helper()
	res, err := e.d().ClaimBatch(e.ctx, limit, time.Minute, rules)
	require.NoError(e.t, err)
	return res
}

// claimOnly claims with a large limit and requires exactly the one row id.
func (e *env) claimOnly(id uuid.UUID) storedriver.Claimed {
	e.t.Helper()
	res := e.claim(100, storedriver.OrderingRules{})
	require.Len(e.t, res.Claimed, 1, "exactly one row is due")
	require.Equal(e.t, id, res.Claimed[0].MessageID)
	return res.Claimed[0]
}

func (e *env) dispatch(rows ...storedriver.Claimed) {
	e.t.Helper()
	n, err := e.d().MarkDispatchedAll(e.ctx, rows)
	require.NoError(e.t, err)
	require.Equal(e.t, len(rows), n)
}

// shift moves column of row id two days into the past (ShiftSQL).
func (e *env) shift(column string, id int64) {
	e.t.Helper()
	require.NoError(e.t, e.Exec(e.ctx, fmt.Sprintf(ShiftSQL[e.Dialect], column), id), "shift %s of row %d", column, id)
}

// sentLongAgo makes row id, which is sent, a row sent two days ago: its sent_at and its
// updated_at, which the statement that records it sent sets to the same time.
func (e *env) sentLongAgo(id int64) {
	e.t.Helper()
	e.shift("sent_at", id)
	e.shift("updated_at", id)
}

// total counts every message row, through Stats.
func (e *env) total() int64 {
	e.t.Helper()
	st, err := e.d().Stats(e.ctx)
	require.NoError(e.t, err)
	var n int64
	for _, c := range st.ByStatus {
		n += c
	}
	return n
}

// The builders below put one message of topic into each state through the store's
// calls. Each claims with a large limit and requires that only its own row is due, so a
// case creates the pending rows it needs after the rows in other states.

func (e *env) pending(topic string) uuid.UUID {
	e.t.Helper()
	return e.enqueueOne(msg(topic, `{"state": "pending"}`))
}

func (e *env) claimed(topic string) storedriver.Claimed {
	e.t.Helper()
	return e.claimOnly(e.pending(topic))
}

func (e *env) dispatched(topic string) storedriver.Claimed {
	e.t.Helper()
	c := e.claimed(topic)
	e.dispatch(c)
	return c
}

func (e *env) sent(topic string) uuid.UUID {
	e.t.Helper()
	c := e.dispatched(topic)
	s, err := e.d().RecordSent(e.ctx, c.MessageID)
	require.NoError(e.t, err)
	require.NotNil(e.t, s)
	return c.MessageID
}

func (e *env) deadLetter(id uuid.UUID, topic, runID string) {
	e.t.Helper()
	ok, err := e.d().DeadLetter(e.ctx, storedriver.DeadLetter{MessageID: id, Topic: topic, WorkflowID: "outbox-" + id.String(),
		RunID: runID, Attempts: 4, LastError: "gave up after 4 attempts: HTTP 500"})
	require.NoError(e.t, err)
	require.True(e.t, ok, "dead-letter %s", id)
}

func (e *env) dead(topic string) uuid.UUID {
	e.t.Helper()
	id := e.dispatched(topic).MessageID
	e.deadLetter(id, topic, "run-1")
	return id
}

func (e *env) discarded(topic string) uuid.UUID {
	e.t.Helper()
	id := e.dead(topic)
	require.NoError(e.t, e.d().Discard(e.ctx, id, "ops"))
	return id
}

// validationField requires err to be a *storedriver.ValidationError and returns its field.
func validationField(t *testing.T, err error) string {
	t.Helper()
	var verr *storedriver.ValidationError
	require.True(t, errors.As(err, &verr), "want a *storedriver.ValidationError, got %T: %v", err, err)
	return verr.Field
}
