package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/natssink"
	"github.com/outbox-go/outbox/store"
)

// The local brokers scripts/services.sh starts; NATS_URL and RABBITMQ_URL name others.
func natsURL() string { return cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222") }
func rabbitURL() string {
	return cmp.Or(os.Getenv("RABBITMQ_URL"), "amqp://guest:guest@127.0.0.1:5672/")
}

// natsStream makes a JetStream stream of the test's own over <prefix><random>.>, removed
// when the test ends, and returns it with its subject prefix.
func natsStream(t *testing.T, prefix string) (jetstream.Stream, string) {
	t.Helper()
	_, st, prefix := testutil.Stream(t, natsURL(), prefix, 0)
	return st, prefix
}

// enqueueKeyed enqueues n messages of topic, each with the ordering key keys[i%len(keys)]
// (none when keys is empty) and its sequence number within the key in the payload.
func (e *env) enqueueKeyed(t *testing.T, topic string, n int, keys ...string) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, 0, n)
	for i := range n {
		m := store.Message{Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"seq": %d}`, i))}
		if len(keys) > 0 {
			m.OrderingKey = keys[i%len(keys)]
			m.Payload = json.RawMessage(fmt.Sprintf(`{"key": %q, "seq": %d}`, m.OrderingKey, i/len(keys)))
		}
		id, err := e.store.Enqueue(context.Background(), e.pool, m)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

// sentCount counts the rows of ids that are sent.
func (e *env) sentCount(t *testing.T, ids []uuid.UUID) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+e.store.Schema()+`.outbox_messages WHERE message_id = ANY($1) AND status = 'sent'`, ids).Scan(&n))
	return n
}

// waitAllSent waits until every row of ids is sent.
func (e *env) waitAllSent(t *testing.T, ids []uuid.UUID, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return e.sentCount(t, ids) == len(ids) }, within, 200*time.Millisecond,
		"not every message was sent")
}

// requireOnceEach checks that got holds each of ids exactly once.
func requireOnceEach(t *testing.T, ids []uuid.UUID, got []string) {
	t.Helper()
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = id.String()
	}
	slices.Sort(want)
	got = slices.Clone(got)
	slices.Sort(got)
	require.Equal(t, want, got, "each message once")
}

// publishThenFail publishes through the topic's sink, then reports the first attempt as
// failed after the publish (an ack lost on the way back): the workflow sends again.
type publishThenFail struct{ delivery.Handler }

func (p publishThenFail) Send(ctx context.Context, d delivery.Message) error {
	if err := p.Handler.Send(ctx, d); err != nil || d.Attempt > 1 {
		return err
	}
	return delivery.Ambiguous(errors.New("connection lost before the publish ack"))
}

// TestNATSSink: messages reach a JetStream stream once each, with the message ID as
// Nats-Msg-Id; a resend after an ambiguous failure (inside the duplicate window) is
// absorbed by the stream.
func TestNATSSink(t *testing.T) {
	t.Parallel()
	st, prefix := natsStream(t, "outbox_e2e_")

	e := newEnv(t, newServer(t))
	// The default delivery policy: a resend waits the default first retry interval.
	topic := config.Topic{Sink: "nats", URL: natsURL(), Subject: prefix + ".{topic}"}
	e.cfg.Topics["order.created"] = topic
	e.cfg.Topics["order.resent"] = topic
	sec, err := topic.Secrets()
	require.NoError(t, err)
	resent, err := topic.NewSink("order.resent", sec, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resent.(*natssink.Sink).Close() })
	e.handlers = map[string]delivery.Handler{"order.resent": publishThenFail{resent}}
	e.startWorker(t)
	e.startRelay(t)

	ids := e.enqueueKeyed(t, "order.created", 50)
	resentID := e.enqueueOrderPlain(t, "order.resent", nil)
	e.waitAllSent(t, append(slices.Clone(ids), resentID), 2*time.Minute)

	read := func(subject string, n int) []string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		require.NoError(t, err)
		var got []string
		for len(got) < n {
			batch, err := cons.Fetch(n-len(got), jetstream.FetchMaxWait(5*time.Second))
			require.NoError(t, err)
			for m := range batch.Messages() {
				require.Equal(t, m.Headers().Get(jetstream.MsgIDHeader), m.Headers().Get(sinks.HeaderMessageID))
				got = append(got, m.Headers().Get(jetstream.MsgIDHeader))
			}
			require.NoError(t, batch.Error())
		}
		return got
	}
	requireOnceEach(t, ids, read(prefix+".order.created", len(ids)))
	requireOnceEach(t, []uuid.UUID{resentID}, read(prefix+".order.resent", 1))
	info, err := st.Info(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, len(ids)+1, info.State.Msgs, "the stream stored each message once, the resent one too")
	row, err := e.store.Get(context.Background(), resentID)
	require.NoError(t, err)
	require.Equal(t, 1, row.RetryTimes, "the resent message was published twice")
}

// rabbitTopology declares a durable direct exchange and a durable queue bound to it by
// key, removed when the test ends.
func rabbitTopology(t *testing.T, key string) (exchange, queue string) {
	t.Helper()
	conn, err := amqp.Dial(rabbitURL())
	require.NoError(t, err, "RabbitMQ must run at %s: run scripts/services.sh", redact.URL(rabbitURL()))
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	name := "outbox-e2e-" + uuid.NewString()[:8]
	require.NoError(t, ch.ExchangeDeclare(name, "direct", true, false, false, false, nil))
	_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(name, key, name, false, nil))
	t.Cleanup(func() {
		conn, err := amqp.Dial(rabbitURL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.ExchangeDelete(name, false, false)
		}
	})
	return name, name
}

// drainQueue reads the message IDs in queue until it stays empty.
func drainQueue(t *testing.T, queue string) []string {
	t.Helper()
	conn, err := amqp.Dial(rabbitURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	var ids []string
	for {
		m, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return ids
		}
		require.Equal(t, amqp.Persistent, m.DeliveryMode)
		require.Equal(t, m.MessageId, m.Headers[sinks.HeaderMessageID])
		ids = append(ids, m.MessageId)
	}
}

// rabbitInUse keeps restartRabbitMQ from taking the broker away under another test: a
// test that uses RabbitMQ without restarting it holds it for reading for its whole run
// (useRabbitMQ), a restart holds it for writing.
var rabbitInUse sync.RWMutex

// useRabbitMQ holds the broker for t: no other test restarts it until t ends. Call it
// before any other cleanup that needs the broker is registered.
func useRabbitMQ(t *testing.T) {
	t.Helper()
	rabbitInUse.RLock()
	t.Cleanup(rabbitInUse.RUnlock)
}

// restartRabbitMQ stops the broker's application (every connection drops, the port
// closes) for outage, then starts it again, once no other test uses it.
func restartRabbitMQ(t *testing.T, outage time.Duration) {
	t.Helper()
	rabbitInUse.Lock()
	defer rabbitInUse.Unlock()
	ctl := func(args ...string) {
		out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl %s: %s", strings.Join(args, " "), out)
	}
	ctl("stop_app")
	started := false
	t.Cleanup(func() {
		if !started {
			_ = exec.Command("rabbitmqctl", "start_app").Run()
		}
	})
	time.Sleep(outage)
	ctl("start_app")
	ctl("await_startup")
	started = true
}

// TestRabbitMQSink: messages reach a bound queue persistent, with message_id set; an
// unroutable message is dead-lettered with the reason; the broker restarted mid-run loses
// nothing (a publish in doubt when the broker went away is sent again, so the queue may
// hold a message twice: consumers de-duplicate by message_id).
func TestRabbitMQSink(t *testing.T) {
	t.Parallel()
	if os.Getenv("RABBITMQ_URL") != "" && os.Getenv("RABBITMQ_URL") != "amqp://guest:guest@127.0.0.1:5672/" {
		t.Skip("the broker restart needs the local RabbitMQ")
	}
	exchange, queue := rabbitTopology(t, "order.created")
	e := newEnv(t, newServer(t))
	e.cfg.Topics["order.created"] = config.Topic{Sink: "rabbitmq", URL: rabbitURL(), Exchange: exchange}
	e.cfg.Topics["order.unroutable"] = config.Topic{Sink: "rabbitmq", URL: rabbitURL(), Exchange: exchange, RoutingKey: "nobody.listens"}
	e.startWorker(t)
	e.startRelay(t)

	unroutable := e.enqueueOrderPlain(t, "order.unroutable", nil)
	// A writer enqueues a message every 40ms; the broker goes down for 5s once 30 are
	// sent, while the writer goes on, and comes back. The default delivery policy retries
	// through the outage.
	const n = 150
	enqueued := make(chan uuid.UUID, n)
	go func() {
		defer close(enqueued)
		for range n {
			enqueued <- e.enqueueKeyed(t, "order.created", 1)[0]
			time.Sleep(40 * time.Millisecond)
		}
	}()
	var all []uuid.UUID
	for len(all) < 30 {
		all = append(all, <-enqueued)
	}
	require.Eventually(t, func() bool { return e.sentCount(t, all) >= 30 }, time.Minute, 20*time.Millisecond)
	restartRabbitMQ(t, 5*time.Second)
	for id := range enqueued {
		all = append(all, id)
	}
	e.waitAllSent(t, all, 3*time.Minute)
	var retried int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+e.store.Schema()+`.outbox_messages WHERE message_id = ANY($1) AND retry_times > 0`, all).Scan(&retried))
	require.NotZero(t, retried, "some sends met the outage")

	got := drainQueue(t, queue)
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	for _, id := range all {
		require.NotZero(t, seen[id.String()], "message %s lost", id)
	}
	require.Len(t, seen, len(all), "only the outbox's messages")
	t.Logf("%d messages, %d copies in the queue (resends after the restart: %d)", len(all), len(got), len(got)-len(all))

	e.waitStatus(t, unroutable, store.StatusDead)
	row, err := e.store.Get(context.Background(), unroutable)
	require.NoError(t, err)
	require.NotNil(t, row.LastError)
	require.Contains(t, *row.LastError, "unroutable")
	require.Contains(t, *row.LastError, `routing key "nobody.listens"`)
	require.Equal(t, 1, row.RetryTimes, "one failed attempt: an unroutable message is not retried")
}

// TestKafkaSink: messages reach a Kafka topic (an in-process kfake cluster of three
// brokers) once each, keyed by their ordering key, each key's messages in order.
func TestKafkaSink(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(4, "orders"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)

	e := newEnv(t, newServer(t))
	e.cfg.Topics["order.created"] = config.Topic{Sink: "kafka", Brokers: cluster.ListenAddrs(), Topic: "orders"}
	e.startWorker(t)
	e.startRelay(t)

	keys := []string{"customer-1", "customer-2", "customer-3", "customer-4", "customer-5"}
	ids := e.enqueueKeyed(t, "order.created", 100, keys...)
	unkeyed := e.enqueueKeyed(t, "order.created", 5)
	e.waitAllSent(t, append(slices.Clone(ids), unkeyed...), 2*time.Minute)

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	t.Cleanup(consumer.Close)
	var got []string
	seqs := map[string][]int{}
	partitions := map[string]map[int32]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(got) < len(ids)+len(unkeyed) {
		fetches := consumer.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "read %d records", len(got))
		fetches.EachRecord(func(r *kgo.Record) {
			var id, ordKey string
			for _, h := range r.Headers {
				switch h.Key {
				case sinks.HeaderMessageID:
					id = string(h.Value)
				case sinks.HeaderOrderingKey:
					ordKey = string(h.Value)
				}
			}
			got = append(got, id)
			if ordKey == "" {
				require.Equal(t, id, string(r.Key), "a message without an ordering key is keyed by its ID")
				return
			}
			require.Equal(t, ordKey, string(r.Key))
			var p struct{ Seq int }
			require.NoError(t, json.Unmarshal(r.Value, &p))
			seqs[ordKey] = append(seqs[ordKey], p.Seq)
			if partitions[ordKey] == nil {
				partitions[ordKey] = map[int32]bool{}
			}
			partitions[ordKey][r.Partition] = true
		})
	}
	requireOnceEach(t, append(slices.Clone(ids), unkeyed...), got)
	for _, k := range keys {
		require.True(t, slices.IsSorted(seqs[k]), "key %s arrived out of order: %v", k, seqs[k])
		require.Len(t, seqs[k], 20)
		require.Len(t, partitions[k], 1, "key %s in one partition", k)
	}
}

// TestWorkerStartsWhileABrokerIsDown: a broker that cannot be reached when the worker
// starts (an outage, a deploy) does not stop the worker: its other topics deliver, the
// sink is reported not ready on /readyz and in outbox_sink_ready (without credentials),
// and once the broker is back the sink connects and the message that waited is
// delivered, under the default policy. What no retry fixes (a subject no stream
// captures, refused credentials) still stops the start, naming the topic.
func TestWorkerStartsWhileABrokerIsDown(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	ctx := context.Background()
	nc, err := nats.Connect(natsURL())
	require.NoError(t, err, "NATS must run at %s: run scripts/services.sh", redact.URL(natsURL()))
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	streamName := "outbox_down_" + e.store.Schema()
	_, err = testutil.CreateStream(ctx, js, jetstream.StreamConfig{Name: streamName, Subjects: []string{streamName + ".>"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), streamName) })
	broker := newPGProxy(t, strings.TrimPrefix(natsURL(), "nats://"))
	broker.down()

	topics := map[string]config.Topic{
		"order.created":   e.cfg.Topics["order.created"],
		"order.published": {Sink: "nats", URL: "nats://" + broker.addr, Subject: streamName + ".orders"},
		"order.queued":    {Sink: "rabbitmq", URL: "amqp://outbox:hunter2@127.0.0.1:1/"},
	}
	a, err := app.Open(ctx, &config.Config{
		DatabaseURL: testdb.URL(),
		Schema:      e.store.Schema(),
		Temporal:    config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: e.namespace, TaskQueue: e.taskQueue},
		Relay:       config.Relay{PollInterval: config.Duration(200 * time.Millisecond)},
		Metrics:     config.Metrics{Address: "127.0.0.1:0"},
		Topics:      topics,
	}, app.Options{Logger: logger})
	require.NoError(t, err)
	t.Cleanup(a.Close)
	require.NoError(t, a.DialTemporal(ctx))
	addr, err := a.ServeMetrics()
	require.NoError(t, err)
	base := "http://" + addr.String()
	e.run(t, func(ctx context.Context) error { return a.RunWorker(ctx, app.Handlers{}) })
	e.run(t, a.RunRelay)

	published := e.enqueueOrderPlain(t, "order.published", nil)
	created := e.enqueueOrderPlain(t, "order.created", nil)
	e.waitStatus(t, created, store.StatusSent) // the worker runs, and its http topic delivers

	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = testutil.HTTPGet(t, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "sink of order.published not connected")
	}, 20*time.Second, 100*time.Millisecond, "readyz names the sink that is down: %s", body)
	require.Contains(t, body, "connect to nats nats://"+broker.addr)
	m := testutil.Scrape(t, base+"/metrics")
	require.Equal(t, 0.0, m[`outbox_sink_ready{topic="order.published"}`])
	require.Equal(t, 0.0, m[`outbox_sink_ready{topic="order.queued"}`])
	require.NotContains(t, body, "hunter2")
	row, err := e.store.Get(ctx, published)
	require.NoError(t, err)
	require.NotEqual(t, store.StatusSent, row.Status, "nothing reached the stream")

	broker.up(t)
	e.waitStatus(t, published, store.StatusSent)
	require.Eventually(t, func() bool {
		return testutil.Scrape(t, base+"/metrics")[`outbox_sink_ready{topic="order.published"}`] == 1
	}, 20*time.Second, 200*time.Millisecond, "the sink connects again in the background")
	st, err := js.Stream(ctx, streamName)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "the message that waited, once")

	t.Run("WhatNoRetryFixesStopsTheStart", func(t *testing.T) {
		for name, tc := range map[string]struct {
			topic config.Topic
			want  string
		}{
			"NoStream":           {config.Topic{Sink: "nats", URL: natsURL(), Subject: "outbox.nostream." + e.store.Schema()}, "no JetStream stream captures subject"},
			"RefusedCredentials": {config.Topic{Sink: "rabbitmq", URL: strings.Replace(rabbitURL(), "guest:guest@", "guest:hunter2@", 1)}, "rabbitmq: connect to"},
		} {
			a, err := app.Connect(ctx, &config.Config{
				DatabaseURL: testdb.URL(),
				Schema:      e.store.Schema(),
				Temporal:    config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: e.namespace, TaskQueue: e.taskQueue},
				Topics:      map[string]config.Topic{"order.bad": tc.topic},
			}, app.Options{Logger: logger})
			require.NoError(t, err)
			err = a.RunWorker(ctx, app.Handlers{})
			a.Close()
			require.Error(t, err, name)
			require.Contains(t, err.Error(), "topic order.bad: ", name)
			require.Contains(t, err.Error(), tc.want, name)
			require.NotContains(t, err.Error(), "hunter2", name)
		}
	})
}
