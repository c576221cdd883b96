package metrics_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

func TestMetrics(t *testing.T) {
	t.Parallel()

	t.Run("NilRecordsNothing", func(t *testing.T) {
		t.Parallel()
		var m *metrics.Metrics
		m.Batch(3, time.Second)
		m.WorkflowStarted()
		m.WorkflowAlreadyStarted()
		m.SendAttempt("t")
		m.SendFailed("t", workflows.ErrTypeRetryable)
		m.Sent("t", time.Second)
		m.DeadLettered("t")
		m.Redriven("t")
		m.Error(metrics.OpClaim)
	})

	t.Run("RegisteringTwiceFails", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		_, err := metrics.New(reg)
		require.NoError(t, err)
		_, err = metrics.New(reg)
		require.ErrorContains(t, err, "register outbox metrics")
	})

	t.Run("Exposition", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		m, err := metrics.New(reg)
		require.NoError(t, err)
		m.KnownTopics("order.created", "order.failing")
		m.Batch(3, 20*time.Millisecond)
		m.Batch(0, time.Second) // empty claims are not batches
		m.WorkflowStarted()
		m.SendFailed("order.created", workflows.ErrTypeAmbiguous)
		m.SendFailed("order.created", "SomethingElse")
		m.Sent("order.created", 1500*time.Millisecond)
		m.Sent("order.created", -1) // counted, not observed
		m.DeadLettered("order.failing")
		m.Redriven("order.failing")
		m.Error(metrics.OpStartWorkflow)
		// Topics a row names but nobody declared share one series, however many there are.
		for i := range 50 {
			m.SendFailed(fmt.Sprintf("rows.invent.%d", i), workflows.ErrTypeUnknownTopic)
		}

		want := `
# HELP outbox_messages_claimed_total Rows the relay claimed (a row claimed again after its lease expired counts again).
# TYPE outbox_messages_claimed_total counter
outbox_messages_claimed_total 3
# HELP outbox_messages_dead_lettered_total Messages moved to the dead-letter table, by topic.
# TYPE outbox_messages_dead_lettered_total counter
outbox_messages_dead_lettered_total{topic="order.failing"} 1
# HELP outbox_messages_redriven_total Dead letters redriven to pending, by topic.
# TYPE outbox_messages_redriven_total counter
outbox_messages_redriven_total{topic="order.failing"} 1
# HELP outbox_messages_sent_total Messages recorded as sent, by topic.
# TYPE outbox_messages_sent_total counter
outbox_messages_sent_total{topic="order.created"} 2
# HELP outbox_send_failures_total Failed send attempts, by topic and kind (permanent, unknown_topic, retryable, ambiguous, other).
# TYPE outbox_send_failures_total counter
outbox_send_failures_total{kind="ambiguous",topic="order.created"} 1
outbox_send_failures_total{kind="other",topic="order.created"} 1
outbox_send_failures_total{kind="unknown_topic",topic="(other)"} 50
# HELP outbox_workflows_started_total Delivery workflows the relay started.
# TYPE outbox_workflows_started_total counter
outbox_workflows_started_total 1
`
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
			"outbox_messages_claimed_total", "outbox_messages_dead_lettered_total", "outbox_messages_redriven_total",
			"outbox_messages_sent_total", "outbox_send_failures_total", "outbox_workflows_started_total"))

		families, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]uint64{}
		for _, f := range families {
			for _, s := range f.GetMetric() {
				if h := s.GetHistogram(); h != nil {
					got[f.GetName()] = h.GetSampleCount()
				}
			}
		}
		require.Equal(t, map[string]uint64{
			"outbox_relay_batch_size": 1, "outbox_relay_batch_duration_seconds": 1, "outbox_commit_to_sent_seconds": 1,
		}, got)

		// Every operation's error series exists from the start.
		n, err := testutil.GatherAndCount(reg, "outbox_errors_total")
		require.NoError(t, err)
		require.Equal(t, 9, n)
	})
}

func TestBacklogCollector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CountsRowsWaitingForARelay", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		m, err := metrics.New(nil)
		require.NoError(t, err)
		m.KnownTopics("a", "quiet")
		c := metrics.NewBacklogCollector(st, 0).LabelTopics(m)
		want := func(a, other int) string {
			s := `
# HELP outbox_backlog_query_failures_total Scrapes whose backlog query failed or timed out.
# TYPE outbox_backlog_query_failures_total counter
outbox_backlog_query_failures_total 0
# HELP outbox_messages_pending Messages committed but not yet handed to Temporal (status pending or claimed), by topic.
# TYPE outbox_messages_pending gauge
`
			if other > 0 {
				s += `outbox_messages_pending{topic="(other)"} ` + strconv.Itoa(other) + "\n"
			}
			return s + `outbox_messages_pending{topic="a"} ` + strconv.Itoa(a) + `
outbox_messages_pending{topic="quiet"} 0
`
		}
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(0, 0)), "outbox_messages_pending", "outbox_backlog_query_failures_total"))
		require.Equal(t, 0.0, age(t, c, "a"))

		table := st.Schema() + ".outbox_messages"
		_, err = pool.Exec(ctx, `INSERT INTO `+table+` (topic, payload, status, created_at, sent_at) VALUES
			('a', '{}', 'pending', now() - interval '90 seconds', NULL),
			('a', '{}', 'sent', now() - interval '1 hour', now())`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+table+` (topic, payload, next_retry_at, created_at) VALUES
			('a', '{}', now() + interval '1 hour', now() - interval '2 hours')`)
		require.NoError(t, err)
		_, err = st.ClaimBatch(ctx, 1, time.Minute, store.OrderingRules{}) // the oldest due row becomes claimed
		require.NoError(t, err)
		_, err = st.Enqueue(ctx, pool, store.Message{Topic: "a", Payload: []byte(`{}`)})
		require.NoError(t, err)

		// Topics not declared are counted together.
		for _, topic := range []string{"b", "c"} {
			_, err = st.Enqueue(ctx, pool, store.Message{Topic: topic, Payload: []byte(`{}`)})
			require.NoError(t, err)
		}

		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want(3, 2)), "outbox_messages_pending", "outbox_backlog_query_failures_total"))
		// The row not due for an hour does not count towards the age; the claimed one does.
		a := age(t, c, "a")
		require.GreaterOrEqual(t, a, 90.0)
		require.Less(t, a, 3600.0)
		require.Less(t, age(t, c, metrics.OtherTopic), 90.0)
		require.Equal(t, 0.0, age(t, c, "quiet"))

		// Without LabelTopics every topic with waiting rows has its own series.
		plain := metrics.NewBacklogCollector(st, 0)
		require.Equal(t, 3, testutil.CollectAndCount(plain, "outbox_messages_pending"))

		// A paused topic: 1 while the pause lasts, its age 0 (nothing of it is due); a
		// paused topic under (other) makes (other) 1.
		pausedWant := func(a, other int) string {
			return fmt.Sprintf(`
# HELP outbox_topic_paused 1 while the topic is paused (outbox topic pause): its messages wait for the resume; 0 otherwise. Under (other), 1 while any such topic is.
# TYPE outbox_topic_paused gauge
outbox_topic_paused{topic="(other)"} %d
outbox_topic_paused{topic="a"} %d
outbox_topic_paused{topic="quiet"} 0
`, other, a)
		}
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(pausedWant(0, 0)), "outbox_topic_paused"))
		for _, topic := range []string{"a", "c"} {
			_, _, err = st.PauseTopic(ctx, topic, "ops", "")
			require.NoError(t, err)
		}
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(pausedWant(1, 1)), "outbox_topic_paused"))
		require.Equal(t, 0.0, age(t, c, "a"))
		_, _, err = st.ResumeTopic(ctx, "a")
		require.NoError(t, err)
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(pausedWant(0, 1)), "outbox_topic_paused"))
		require.GreaterOrEqual(t, age(t, c, "a"), 90.0)
	})

	t.Run("UnreachableDatabaseLeavesTheGaugesOut", func(t *testing.T) {
		t.Parallel()
		pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		st, err := store.New(pool, store.Config{})
		require.NoError(t, err)
		c := metrics.NewBacklogCollector(st, time.Second)
		require.Equal(t, 1, testutil.CollectAndCount(c))
		require.Equal(t, 1, testutil.CollectAndCount(c, "outbox_backlog_query_failures_total"))
		require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP outbox_backlog_query_failures_total Scrapes whose backlog query failed or timed out.
# TYPE outbox_backlog_query_failures_total counter
outbox_backlog_query_failures_total 3
`)))
	})
}

// age returns the value of outbox_oldest_pending_age_seconds for topic.
func age(t *testing.T, c prometheus.Collector, topic string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "outbox_oldest_pending_age_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == topic {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no outbox_oldest_pending_age_seconds{topic=%q}", topic)
	return 0
}
