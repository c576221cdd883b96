package kafkasink_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/kafkasink"
)

// newCluster starts an in-process Kafka cluster, closed when the test ends.
func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(opts...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// newSink builds a sink, closed when the test ends.
func newSink(t *testing.T, cfg kafkasink.Config) *kafkasink.Sink {
	t.Helper()
	h, err := kafkasink.New("orders", cfg)
	require.NoError(t, err)
	s, ok := h.(*kafkasink.Sink)
	require.True(t, ok, "New returns a *Sink, got %T", h)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// openSink builds a sink on c's brokers and opens it.
func openSink(t *testing.T, c *kfake.Cluster, cfg kafkasink.Config) *kafkasink.Sink {
	t.Helper()
	cfg.Brokers = c.ListenAddrs()
	s := newSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.Open(ctx))
	return s
}

// delivery is message seq of an ordering key (none when key is empty).
func testMessage(topic, key string, seq int) delivery.Message {
	return delivery.Message{
		MessageID:   uuid.NewString(),
		Topic:       topic,
		Payload:     json.RawMessage(fmt.Sprintf(`{"key":%q,"seq":%d}`, key, seq)),
		Headers:     map[string]string{"Tenant": "acme"},
		OrderingKey: key,
		CreatedAt:   time.Now().Add(-time.Minute).Truncate(time.Millisecond),
		Attempt:     1,
		MaxAttempts: 5,
	}
}

// sendCtx bounds one send, as the activity's start-to-close timeout does.
func sendCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// consume reads n records of topic from the start.
func consume(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "consumed %d of %d records", len(out), n)
		fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", topic, p, err) })
		fetches.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// recordsIn returns how many records topic's partitions hold: the sum of their end offsets.
func recordsIn(t *testing.T, c *kfake.Cluster, topic string, partitions int32) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.Timestamp = -1 // the end offset
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	var total int64
	var seen int32
	for _, t2 := range resp.Topics {
		for _, p := range t2.Partitions {
			require.NoError(t, kerr.ErrorForCode(p.ErrorCode), "partition %d", p.Partition)
			total += p.Offset
			seen++
		}
	}
	require.Equal(t, partitions, seen)
	return total
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func TestSendDeliversEachMessageOnceInKeyOrder(t *testing.T) {
	t.Parallel()
	const (
		partitions = 6
		keys       = 10
		perKey     = 10
	)
	c := newCluster(t, kfake.NumBrokers(3), kfake.SeedTopics(partitions, "orders"))
	s := openSink(t, c, kafkasink.Config{Headers: map[string]string{"Source": "outbox-test", "Tenant": "overridden"}})

	// Keys 0..8 are ordering keys; the messages of "key" 9 have none, so each is keyed by
	// its message ID. Keys run concurrently; each key's messages are sent one after the
	// other, as the outbox delivers them.
	keyOf := func(k int) string {
		if k == keys-1 {
			return ""
		}
		return fmt.Sprintf("customer-%d", k)
	}
	sent := make(map[string]delivery.Message)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			for seq := range perKey {
				d := testMessage("orders", keyOf(k), seq)
				if err := s.Send(sendCtx(t, 10*time.Second), d); err != nil {
					t.Errorf("send %s #%d: %v", keyOf(k), seq, err)
					return
				}
				mu.Lock()
				sent[d.MessageID] = d
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, sent, keys*perKey)

	records := consume(t, c, "orders", keys*perKey)
	require.Len(t, records, keys*perKey)
	require.EqualValues(t, keys*perKey, recordsIn(t, c, "orders", partitions), "no record written twice")

	type position struct {
		partition int32
		offset    int64
	}
	byKey := map[string][]position{}
	got := map[string]bool{}
	for _, r := range records {
		idText, ok := header(r, sinks.HeaderMessageID)
		require.True(t, ok, "record without %s", sinks.HeaderMessageID)
		id := uuid.MustParse(idText).String()
		require.False(t, got[id], "message %s consumed twice", id)
		got[id] = true
		d, ok := sent[id]
		require.True(t, ok, "message %s was not sent", id)

		wantKey := d.OrderingKey
		if wantKey == "" {
			wantKey = d.MessageID
		}
		assert.Equal(t, wantKey, string(r.Key))
		assert.JSONEq(t, string(d.Payload), string(r.Value))
		assert.True(t, d.CreatedAt.Equal(r.Timestamp), "timestamp %s, want the message's creation time %s", r.Timestamp, d.CreatedAt)
		for k, want := range map[string]string{
			sinks.HeaderTopic:     "orders",
			sinks.HeaderCreatedAt: d.CreatedAt.UTC().Format(time.RFC3339Nano),
			sinks.HeaderAttempt:   "1",
			"Content-Type":        "application/json",
			"Source":              "outbox-test",
			"Tenant":              "acme", // the message's header wins over the sink's
		} {
			v, _ := header(r, k)
			assert.Equal(t, want, v, "header %s", k)
		}
		ordKey, has := header(r, sinks.HeaderOrderingKey)
		assert.Equal(t, d.OrderingKey != "", has)
		assert.Equal(t, d.OrderingKey, ordKey)

		if d.OrderingKey != "" {
			var body struct{ Seq int }
			require.NoError(t, json.Unmarshal(r.Value, &body))
			positions := byKey[d.OrderingKey]
			for len(positions) <= body.Seq {
				positions = append(positions, position{offset: -1})
			}
			positions[body.Seq] = position{r.Partition, r.Offset}
			byKey[d.OrderingKey] = positions
		}
	}
	require.Len(t, byKey, keys-1)
	for key, positions := range byKey {
		require.Len(t, positions, perKey, "key %s", key)
		for seq := 1; seq < perKey; seq++ {
			prev, cur := positions[seq-1], positions[seq]
			assert.Equal(t, prev.partition, cur.partition, "key %s: message %d is in another partition than %d", key, seq, seq-1)
			assert.Greater(t, cur.offset, prev.offset, "key %s: message %d is before message %d", key, seq, seq-1)
		}
	}
}

func TestSendTopicTemplate(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "orders.v1"))
	s := openSink(t, c, kafkasink.Config{Topic: "{topic}.v1"})

	d := testMessage("orders", "", 0)
	require.NoError(t, s.Send(sendCtx(t, 10*time.Second), d))
	r := consume(t, c, "orders.v1", 1)[0]
	id, _ := header(r, sinks.HeaderMessageID)
	assert.Equal(t, d.MessageID, id)
	topic, _ := header(r, sinks.HeaderTopic)
	assert.Equal(t, "orders", topic, "the header names the outbox topic")

	t.Run("OrderingKeyMissing", func(t *testing.T) {
		s := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs(), Topic: "orders.{ordering_key}"})
		err := s.Send(sendCtx(t, 5*time.Second), testMessage("orders", "", 0))
		require.Error(t, err)
		assert.True(t, delivery.IsPermanent(err), "%v", err)
	})
	t.Run("InvalidExpansion", func(t *testing.T) {
		s := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs(), Topic: "orders.{ordering_key}"})
		err := s.Send(sendCtx(t, 5*time.Second), testMessage("orders", "a b/c", 0))
		require.Error(t, err)
		assert.True(t, delivery.IsPermanent(err), "%v", err)
		assert.Contains(t, err.Error(), `"orders.a b/c" is not a valid Kafka topic name`)
	})
}

func TestMissingTopic(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "orders"))

	t.Run("Open", func(t *testing.T) {
		t.Parallel()
		s := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs(), Topic: "payments"})
		err := s.Open(sendCtx(t, 5*time.Second))
		require.Error(t, err)
		assert.Contains(t, err.Error(), `kafka topic "payments" does not exist`)
	})
	t.Run("OpenSkipsTemplates", func(t *testing.T) {
		t.Parallel()
		s := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs(), Topic: "{topic}.v2"})
		require.NoError(t, s.Open(sendCtx(t, 5*time.Second)))
	})
	t.Run("Send", func(t *testing.T) {
		t.Parallel()
		s := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs()})
		start := time.Now()
		err := s.Send(sendCtx(t, 15*time.Second), testMessage("payments", "k", 0))
		require.Error(t, err)
		assert.True(t, delivery.IsPermanent(err), "%v", err)
		assert.Contains(t, err.Error(), `kafka topic "payments" does not exist`)
		t.Logf("missing topic reported after %s", time.Since(start))

		// The sink still delivers to topics that exist.
		require.NoError(t, s.Send(sendCtx(t, 10*time.Second), testMessage("orders", "k", 1)))
	})
}

func TestOpenUnreachableCluster(t *testing.T) {
	t.Parallel()
	s := newSink(t, kafkasink.Config{Brokers: []string{"127.0.0.1:1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.Open(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connect to kafka brokers 127.0.0.1:1: ")
	assert.NoError(t, ctx.Err(), "Open returned only when its context ended")
}

func TestSendToUnreachableBrokersFailsWithinTheAttempt(t *testing.T) {
	t.Parallel()
	// No broker answers: the client gives the record up before the attempt ends, and
	// Send reports a failure the workflow retries. (The client gives up a fifth of the
	// attempt before its end: 3 s leave it 600 ms to return on a loaded machine.)
	s := newSink(t, kafkasink.Config{Brokers: []string{"127.0.0.1:1"}})
	ctx := sendCtx(t, 3*time.Second)
	err := s.Send(ctx, testMessage("orders", "k", 0))
	require.Error(t, err)
	assert.False(t, delivery.IsPermanent(err), "%v", err)
	assert.NoError(t, ctx.Err(), "Send returned before the attempt ended")
}

func TestSendUnansweredIsAmbiguous(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	s := openSink(t, c, kafkasink.Config{})
	// The broker reads the produce request but never answers: the record may be written.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true
	})
	err := s.Send(sendCtx(t, time.Second), testMessage("orders", "k", 0))
	require.Error(t, err)
	assert.True(t, delivery.IsAmbiguous(err), "%v", err)
	assert.Contains(t, err.Error(), "may still be written")
}

func TestSendBrokerRefusal(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	s := openSink(t, c, kafkasink.Config{})
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	err := s.Send(sendCtx(t, 5*time.Second), testMessage("orders", "k", 0))
	require.Error(t, err)
	assert.True(t, delivery.IsPermanent(err), "%v", err)
	assert.ErrorIs(t, err, kerr.TopicAuthorizationFailed)

	t.Run("MessageTooLarge", func(t *testing.T) {
		d := testMessage("orders", "k", 1)
		d.Payload = json.RawMessage(`"` + strings.Repeat("x", 2<<20) + `"`)
		err := s.Send(sendCtx(t, 5*time.Second), d)
		require.Error(t, err)
		assert.True(t, delivery.IsPermanent(err), "%v", err)
		assert.ErrorIs(t, err, kerr.MessageTooLarge)
	})
}

func TestClose(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	s := openSink(t, c, kafkasink.Config{})
	require.NoError(t, s.Send(sendCtx(t, 10*time.Second), testMessage("orders", "k", 0)))
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice")

	err := s.Send(sendCtx(t, 5*time.Second), testMessage("orders", "k", 1))
	require.Error(t, err)
	_, ok := delivery.IsRetryable(err)
	assert.True(t, ok, "%v", err)
	assert.Error(t, s.Open(sendCtx(t, 5*time.Second)))
}

func TestSendWithoutOpen(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	s := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs()})
	require.NoError(t, s.Send(sendCtx(t, 10*time.Second), testMessage("orders", "k", 0)), "the client is created on first use")
	consume(t, c, "orders", 1)
}

func TestSASLPlain(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "outbox", "right-password"), kfake.SeedTopics(1, "orders"))

	_, err := kafkasink.New("orders", kafkasink.Config{Brokers: c.ListenAddrs(), Username: "outbox", Password: "right-password"})
	require.ErrorContains(t, err, "SASL/PLAIN without tls sends the password in plaintext", "refused without tls or allow_plaintext_auth")
	assert.NotContains(t, err.Error(), "right-password")

	s := openSink(t, c, kafkasink.Config{Username: "outbox", Password: "right-password", AllowPlaintextAuth: true})
	require.NoError(t, s.Send(sendCtx(t, 10*time.Second), testMessage("orders", "k", 0)))

	bad := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs(), Username: "outbox", Password: "wrong-password", AllowPlaintextAuth: true})
	err = bad.Open(sendCtx(t, 5*time.Second))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "wrong-password")
	assert.NotContains(t, err.Error(), "right-password")
}

func TestTLS(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t, "127.0.0.1")
	c := newCluster(t, kfake.TLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.Server}}), kfake.SeedTopics(1, "orders"))

	s := openSink(t, c, kafkasink.Config{TLS: sinks.TLSFiles{CAFile: p.CAFile}})
	require.NoError(t, s.Send(sendCtx(t, 10*time.Second), testMessage("orders", "k", 0)))

	// With TLS on but the system's roots only, the server's certificate is not trusted.
	plain := newSink(t, kafkasink.Config{Brokers: c.ListenAddrs(), TLS: sinks.TLSFiles{Enabled: true}})
	err := plain.Open(sendCtx(t, 5*time.Second))
	require.ErrorContains(t, err, "certificate")
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	ok := []string{"127.0.0.1:9092"}
	for _, tc := range []struct {
		name string
		cfg  kafkasink.Config
		want string
	}{
		{"NoBrokers", kafkasink.Config{}, "brokers: must list at least one seed broker (host:port)"},
		{"NoPort", kafkasink.Config{Brokers: []string{"k1:9092", "k2"}}, `brokers[1]: must be host:port, such as kafka-1:9092, got "k2"`},
		{"URL", kafkasink.Config{Brokers: []string{"kafka://k1:9092"}}, `brokers[0]: must be host:port`},
		{"UnknownPlaceholder", kafkasink.Config{Brokers: ok, Topic: "{nope}"}, "topic: unknown placeholder {nope}"},
		{"InvalidTopic", kafkasink.Config{Brokers: ok, Topic: "orders/created"}, `topic: "orders/created" is not a valid Kafka topic name`},
		{"UsernameOnly", kafkasink.Config{Brokers: ok, Username: "outbox"}, "password: must be set with username"},
		{"PasswordOnly", kafkasink.Config{Brokers: ok, Password: "s3cret-value"}, "username: must be set with password"},
		{"MissingCA", kafkasink.Config{Brokers: ok, Password: "s3cret-value", Username: "u", TLS: sinks.TLSFiles{CAFile: "/nonexistent/ca.pem"}}, "tls.ca_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := kafkasink.New("orders", tc.cfg)
			require.Error(t, err)
			assert.Nil(t, h)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "s3cret-value")
		})
	}

	t.Run("Defaults", func(t *testing.T) {
		h, err := kafkasink.New("orders", kafkasink.Config{Brokers: ok})
		require.NoError(t, err)
		require.IsType(t, &kafkasink.Sink{}, h)
		assert.Equal(t, "{topic}", kafkasink.DefaultTopic)
		require.NoError(t, h.(*kafkasink.Sink).Close())
	})
}

// TestSendBatchProducesTogether hands a batch's records to the client at once: each is
// written once with its headers, and a message whose topic the template cannot make fails
// alone. (Against the in-process cluster: no Kafka broker runs here.)
func TestSendBatchProducesTogether(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(3, "clicks"))
	s := openSink(t, c, kafkasink.Config{Topic: "{ordering_key}"})
	var _ delivery.BatchHandler = s
	var batch []delivery.Message
	for i := range 100 {
		batch = append(batch, testMessage("clicks", "clicks", i))
	}
	batch[7].OrderingKey = "" // {ordering_key} of a message without one: permanent
	errs := s.SendBatch(sendCtx(t, 10*time.Second), batch)
	require.Len(t, errs, 100)
	for i, err := range errs {
		if i == 7 {
			require.True(t, delivery.IsPermanent(err), "%v", err)
			continue
		}
		require.NoError(t, err, "message %d", i)
	}
	ids := map[string]bool{}
	for _, r := range consume(t, c, "clicks", 99) {
		id, ok := header(r, sinks.HeaderMessageID)
		require.True(t, ok)
		require.False(t, ids[id], "record %s written twice", id)
		ids[id] = true
	}
	require.Len(t, ids, 99)
	require.False(t, ids[batch[7].MessageID])
}
