package metrics

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-go/outbox/store"
)

// backlogSQL counts the rows waiting for a relay. Each subquery's WHERE clause is the
// predicate of one of the claim's partial indexes (due at once, delayed, held back), so it
// reads those indexes (a few pages while the relays keep up), not the table's sent rows.
// The age is that of the oldest row that is due and not held back behind its ordering key:
// pending with next_retry_at passed or unset, or claimed.
const backlogSQL = `SELECT
  (SELECT count(*) FROM %[1]s WHERE status IN ('pending', 'claimed') AND next_retry_at IS NULL AND NOT held_back)
  + (SELECT count(*) FROM %[1]s WHERE status IN ('pending', 'claimed') AND next_retry_at IS NOT NULL AND NOT held_back)
  + (SELECT count(*) FROM %[1]s WHERE held_back AND status IN ('pending', 'claimed')),
  COALESCE(EXTRACT(EPOCH FROM now() - LEAST(
    (SELECT min(created_at) FROM %[1]s WHERE status IN ('pending', 'claimed') AND next_retry_at IS NULL AND NOT held_back),
    (SELECT min(created_at) FROM %[1]s WHERE status IN ('pending', 'claimed') AND next_retry_at IS NOT NULL AND NOT held_back
       AND next_retry_at <= now()))), 0)::float8`

// BacklogCollector reports the messages waiting for a relay, read from the database at
// each scrape:
//
//   - outbox_messages_pending: rows with status pending or claimed (committed, not yet
//     handed to Temporal);
//   - outbox_oldest_pending_age_seconds: the age (since created_at) of the oldest such
//     row that is due, 0 when there is none.
//
// A query that fails or exceeds its timeout leaves both out of that scrape and counts
// outbox_backlog_query_failures_total.
type BacklogCollector struct {
	db       store.DB
	query    string
	timeout  time.Duration
	failures atomic.Uint64

	pending, age, failed *prometheus.Desc
}

// NewBacklogCollector returns a collector that queries st's tables with the given
// timeout per scrape (0 means 2s).
func NewBacklogCollector(st *store.Store, timeout time.Duration) *BacklogCollector {
	return &BacklogCollector{
		db:      st.DB(),
		query:   fmt.Sprintf(backlogSQL, pgx.Identifier{st.Schema(), "outbox_messages"}.Sanitize()),
		timeout: cmp.Or(timeout, 2*time.Second),
		pending: prometheus.NewDesc("outbox_messages_pending",
			"Messages committed but not yet handed to Temporal (status pending or claimed).", nil, nil),
		age: prometheus.NewDesc("outbox_oldest_pending_age_seconds",
			"Age since created_at of the oldest due message not yet handed to Temporal; 0 when none.", nil, nil),
		failed: prometheus.NewDesc("outbox_backlog_query_failures_total",
			"Scrapes whose backlog query failed or timed out.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *BacklogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.age
	ch <- c.failed
}

// Collect implements prometheus.Collector.
func (c *BacklogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var n int64
	var age float64
	if err := c.db.QueryRow(ctx, c.query).Scan(&n, &age); err != nil {
		c.failures.Add(1)
	} else {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, max(age, 0))
	}
	ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(c.failures.Load()))
}
