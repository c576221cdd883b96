package metrics

import (
	"cmp"
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-go/outbox/store"
)

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
	st       store.Delivery
	timeout  time.Duration
	failures atomic.Uint64

	pending, age, failed *prometheus.Desc
}

// NewBacklogCollector returns a collector that queries st's tables with the given
// timeout per scrape (0 means 2s).
func NewBacklogCollector(st store.Delivery, timeout time.Duration) *BacklogCollector {
	return &BacklogCollector{
		st:      st,
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
	if n, age, err := c.st.Backlog(ctx); err != nil {
		c.failures.Add(1)
	} else {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, max(age.Seconds(), 0))
	}
	ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(c.failures.Load()))
}
