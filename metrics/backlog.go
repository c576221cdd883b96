package metrics

import (
	"cmp"
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-go/outbox/store"
)

// BacklogCollector reports the messages waiting for a relay, by topic, read from the
// database at each scrape:
//
//   - outbox_messages_pending{topic}: rows with status pending or claimed (committed, not
//     yet handed to Temporal);
//   - outbox_oldest_pending_age_seconds{topic}: the age (since created_at) of the oldest
//     such row that is due, 0 when there is none (and while the topic is paused);
//   - outbox_topic_paused{topic}: 1 while the topic is paused, 0 otherwise.
//
// With [BacklogCollector.LabelTopics], topics not declared with [Metrics.KnownTopics]
// are reported together under [OtherTopic] (their rows added up, the oldest age), and
// every declared topic has its series, 0 while none of its rows waits; without it, each
// topic that has waiting rows is reported under its own name.
//
// A query that fails or exceeds its timeout leaves the three out of that scrape and counts
// outbox_backlog_query_failures_total.
type BacklogCollector struct {
	st       store.Delivery
	timeout  time.Duration
	failures atomic.Uint64
	metrics  *Metrics

	pending, age, paused, failed *prometheus.Desc
}

// NewBacklogCollector returns a collector that queries st's tables with the given
// timeout per scrape (0 means 2s).
func NewBacklogCollector(st store.Delivery, timeout time.Duration) *BacklogCollector {
	return &BacklogCollector{
		st:      st,
		timeout: cmp.Or(timeout, 2*time.Second),
		pending: prometheus.NewDesc("outbox_messages_pending",
			"Messages committed but not yet handed to Temporal (status pending or claimed), by topic.", []string{"topic"}, nil),
		age: prometheus.NewDesc("outbox_oldest_pending_age_seconds",
			"Age since created_at of the oldest due message not yet handed to Temporal, by topic; 0 when none.", []string{"topic"}, nil),
		paused: prometheus.NewDesc("outbox_topic_paused",
			"1 while the topic is paused (outbox topic pause): its messages wait for the resume; 0 otherwise. Under (other), 1 while any such topic is.", []string{"topic"}, nil),
		failed: prometheus.NewDesc("outbox_backlog_query_failures_total",
			"Scrapes whose backlog query failed or timed out.", nil, nil),
	}
}

// LabelTopics makes the collector label topics as m does: the topics m knows under their
// names, every other one under OtherTopic. It returns c.
func (c *BacklogCollector) LabelTopics(m *Metrics) *BacklogCollector {
	c.metrics = m
	return c
}

// Describe implements prometheus.Collector.
func (c *BacklogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.age
	ch <- c.paused
	ch <- c.failed
}

// Collect implements prometheus.Collector.
func (c *BacklogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if backlog, err := c.st.Backlog(ctx); err != nil {
		c.failures.Add(1)
	} else {
		for _, b := range c.byLabel(backlog) {
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(b.Pending), b.Topic)
			ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, max(b.OldestAge.Seconds(), 0), b.Topic)
			paused := 0.0
			if b.Paused {
				paused = 1
			}
			ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, paused, b.Topic)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(c.failures.Load()))
}

// byLabel gathers the topics' backlogs under their labels.
func (c *BacklogCollector) byLabel(backlog []store.TopicBacklog) []store.TopicBacklog {
	if c.metrics == nil {
		return backlog
	}
	labelled := map[string]store.TopicBacklog{}
	c.metrics.mu.RLock()
	for t := range c.metrics.known {
		labelled[t] = store.TopicBacklog{Topic: t}
	}
	c.metrics.mu.RUnlock()
	for _, b := range backlog {
		label := c.metrics.topic(b.Topic)
		l := labelled[label]
		l.Topic, l.Pending, l.OldestAge, l.Paused = label, l.Pending+b.Pending, max(l.OldestAge, b.OldestAge), l.Paused || b.Paused
		labelled[label] = l
	}
	out := make([]store.TopicBacklog, 0, len(labelled))
	for _, l := range labelled {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b store.TopicBacklog) int { return cmp.Compare(a.Topic, b.Topic) })
	return out
}
