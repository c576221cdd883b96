package config_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
)

func parsed(t *testing.T, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse(strings.NewReader(yaml))
	require.NoError(t, err)
	d := c.WithDefaults()
	require.NoError(t, d.Validate())
	return &d
}

// TestCompare: a relay's and a worker's files that agree report nothing; each kind of
// difference a relay and a worker can have about a topic is reported, naming the topic.
func TestCompare(t *testing.T) {
	relay := parsed(t, `
topics:
  order.created: {url: 'http://relay-side', max_attempts: 5}
  stock.reserve: {activity: ReserveStock, task_queue: inventory}
  audit: {sink: nats, url: 'nats://n:4222', ordering: false}
`)
	same := parsed(t, `
topics:
  order.created: {url: 'http://worker-side/other-path', max_attempts: 5}
  stock.reserve: {activity: ReserveStock, task_queue: inventory}
  audit: {sink: nats, url: 'nats://other:4222', subject: 'x.{topic}', ordering: false}
`)
	require.Empty(t, config.Compare(relay, same), "sink settings may differ between processes")

	worker := parsed(t, `
topics:
  order.created: {url: 'http://worker-side', max_attempts: 12}
  stock.reserve: {activity: ReserveStock, task_queue: inventory-v2}
  audit: {sink: rabbitmq, url: 'amqp://r:5672'}
default: {url: 'http://fallback'}
`)
	var got []string
	for _, d := range config.Compare(relay, worker) {
		got = append(got, d.Topic+" "+d.What)
	}
	require.Equal(t, []string{
		"audit ordering", "audit handler",
		"order.created policy",
		"stock.reserve policy", "stock.reserve handler",
		"(default) handler", // the same built-in policy: no entry has the defaults
	}, got)

	d := config.Compare(relay, worker)[2]
	require.Contains(t, d.String(), `topic order.created: policy differs: {"max_attempts":5`)
	require.Contains(t, d.B, `"max_attempts":12`)
}
