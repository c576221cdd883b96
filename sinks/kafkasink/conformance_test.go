package kafkasink_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/kafkasink"
	"github.com/outbox-go/outbox/sinks/sinktest"
)

// kafkaBrokersEnv names the real Kafka brokers the conformance suite runs against.
const kafkaBrokersEnv = "OUTBOX_TEST_KAFKA_BROKERS"

// conformanceBrokers returns the brokers of kafkaBrokersEnv, and skips the test without
// them.
func conformanceBrokers(t *testing.T) []string {
	t.Helper()
	v := strings.TrimSpace(os.Getenv(kafkaBrokersEnv))
	if v == "" {
		t.Skipf("%s is not set: the conformance suite needs a real Kafka broker (scripts/services.sh starts one and exports it)", kafkaBrokersEnv)
	}
	var brokers []string
	for _, b := range strings.Split(v, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	return brokers
}

// conformanceAdmin is a test's own client of the cluster, closed when the test ends.
func conformanceAdmin(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// conformanceTopic creates a topic of the test's own with one partition, deleted when the
// test ends, and waits until the cluster serves it.
func conformanceTopic(t *testing.T, admin *kgo.Client) string {
	t.Helper()
	name := "outbox_conf_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, 1, 1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 20000
	resp, err := req.RequestWith(ctx, admin)
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	for _, r := range resp.Topics {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("create topic %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req := kmsg.NewPtrDeleteTopicsRequest()
		req.TopicNames = []string{name}
		rt := kmsg.NewDeleteTopicsRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, rt)
		req.TimeoutMillis = 15000
		if _, err := req.RequestWith(ctx, admin); err != nil {
			t.Logf("delete topic %s: %v", name, err)
		}
	})
	for {
		if _, err := conformanceEndOffset(ctx, admin, name); err == nil {
			return name
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s is not served within 30s of its creation", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// conformanceEndOffset returns the end offset of the topic's partition 0: how many
// records it holds.
func conformanceEndOffset(ctx context.Context, admin *kgo.Client, topic string) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp = 0, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, admin)
	if err != nil {
		return 0, err
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return 0, fmt.Errorf("no offset for %s[0]", topic)
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		return 0, err
	}
	return p.Offset, nil
}

// topicReceived reads what the topic holds for the message id, from the start.
func topicReceived(brokers []string, admin *kgo.Client, topic string) func(t *testing.T, id string) []sinktest.Received {
	return func(t *testing.T, id string) []sinktest.Received {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var end int64
		for {
			var err error
			if end, err = conformanceEndOffset(ctx, admin, topic); err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("end offset of %s: %v", topic, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if end == 0 {
			return nil
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		var out []sinktest.Received
		for read := int64(0); read < end; {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("read %d of the %d records of %s", read, end, topic)
			}
			fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", topic, p, err) })
			fetches.EachRecord(func(r *kgo.Record) {
				read = max(read, r.Offset+1)
				headers := map[string]string{}
				for _, h := range r.Headers {
					headers[h.Key] = string(h.Value)
				}
				if headers[sinks.HeaderMessageID] != id && string(r.Key) != id {
					return
				}
				// Consumers de-duplicate by Outbox-Message-Id; the record's key is the
				// message ID too when the message has no ordering key.
				key := headers[sinks.HeaderMessageID]
				if string(r.Key) != key {
					key = fmt.Sprintf("%s %q, record key %q", sinks.HeaderMessageID, key, r.Key)
				}
				out = append(out, sinktest.Received{Payload: r.Value, IdempotencyKey: key, Attempt: headers[sinks.HeaderAttempt], Headers: headers})
			})
		}
		return out
	}
}

// conformanceSink builds a sink, closed when the test ends.
func conformanceSink(t *testing.T, cfg kafkasink.Config) *kafkasink.Sink {
	t.Helper()
	h, err := kafkasink.New("orders", cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := h.(*kafkasink.Sink)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the sink conformance suite against the real Kafka broker of
// OUTBOX_TEST_KAFKA_BROKERS, each case on a topic of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	brokers := conformanceBrokers(t)
	sinktest.Run(t, sinktest.Harness{
		Name:           "kafka",
		CarriesAttempt: true,
		SendTimeout:    30 * time.Second,
		New: func(t *testing.T) sinktest.Target {
			admin := conformanceAdmin(t, brokers)
			topic := conformanceTopic(t, admin)
			s := conformanceSink(t, kafkasink.Config{Brokers: brokers, Topic: topic})
			return sinktest.Target{Handler: s, Received: topicReceived(brokers, admin, topic)}
		},
		// A topic that does not exist (the sink never asks the cluster to create one).
		Reject: func(t *testing.T) sinktest.Target {
			return sinktest.Target{Handler: conformanceSink(t, kafkasink.Config{Brokers: brokers, Topic: "outbox_conf_missing_" + uuid.NewString()[:8]})}
		},
		// The produce request reaches the broker through a proxy that holds back its
		// answer. The client dials every broker through a proxy of its own.
		Stall: func(t *testing.T) sinktest.Stalled {
			admin := conformanceAdmin(t, brokers)
			topic := conformanceTopic(t, admin)
			s := conformanceSink(t, kafkasink.Config{Brokers: brokers, Topic: topic})
			var mu sync.Mutex
			proxies := map[string]*sinktest.Proxy{}
			for _, b := range brokers {
				proxies[b] = sinktest.NewProxy(t, b)
			}
			s.DialThrough(func(ctx context.Context, network, host string) (net.Conn, error) {
				mu.Lock()
				p, ok := proxies[host]
				if !ok { // a broker the seeds named: through a proxy too
					p = sinktest.NewProxy(t, host)
					proxies[host] = p
				}
				mu.Unlock()
				var d net.Dialer
				return d.DialContext(ctx, network, p.Addr())
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.Open(ctx); err != nil {
				t.Fatalf("Open through the proxy: %v", err)
			}
			// A first record opens the producer's connection, which the stalled one
			// will go over.
			warm := delivery.Message{MessageID: sinktest.NewMessageID(), Topic: "warm-up", Payload: []byte(`{}`), Attempt: 1, CreatedAt: time.Now()}
			if err := s.Send(ctx, warm); err != nil {
				t.Fatalf("Send through the proxy: %v", err)
			}
			mu.Lock()
			held := make([]*sinktest.Proxy, 0, len(proxies))
			for _, p := range proxies {
				p.Hold()
				held = append(held, p)
			}
			mu.Unlock()
			cut := func() {
				wrote := make(chan *sinktest.Proxy, len(held))
				for _, p := range held {
					go func() {
						select {
						case <-p.Written():
							wrote <- p
						case <-time.After(10 * time.Second):
						}
					}()
				}
				select {
				case p := <-wrote:
					p.Cut()
				case <-time.After(10 * time.Second):
					t.Errorf("no produce request reached a broker within 10s")
				}
			}
			return sinktest.Stalled{Target: sinktest.Target{Handler: s, Received: topicReceived(brokers, admin, topic)}, Cut: cut}
		},
		WithSecret: func(t *testing.T, secret string) []delivery.Handler {
			missing := "outbox_conf_missing_" + uuid.NewString()[:8]
			return []delivery.Handler{
				// The live broker, whose listener takes no SASL.
				conformanceSink(t, kafkasink.Config{Brokers: brokers, Topic: missing, Username: "outbox", Password: secret, AllowPlaintextAuth: true}),
				// The live broker, TLS on a plaintext listener.
				conformanceSink(t, kafkasink.Config{Brokers: brokers, Topic: missing, Username: "outbox", Password: secret, TLS: sinks.TLSFiles{Enabled: true}}),
				// Nothing listens.
				conformanceSink(t, kafkasink.Config{Brokers: []string{"127.0.0.1:1"}, Username: "outbox", Password: secret, AllowPlaintextAuth: true}),
			}
		},
		BadConfig: func(secret string) []error {
			var errs []error
			for _, cfg := range []kafkasink.Config{
				{Brokers: []string{"outbox:" + secret + "@kafka:9092"}},
				{Brokers: []string{"kafka:9092", "kafka://outbox:" + secret + "@kafka:9092"}},
				{Brokers: []string{secret + "@kafka:9092"}},
				{Brokers: []string{"kafka:9092"}, Username: "outbox", Password: secret},
				{Brokers: []string{"kafka:9092"}, Password: secret},
				{Brokers: []string{"kafka:9092"}, Username: "outbox", Password: secret, TLS: sinks.TLSFiles{CAFile: "/nonexistent/ca.pem"}},
			} {
				_, err := kafkasink.New("orders", cfg)
				errs = append(errs, err)
			}
			return errs
		},
		Unsupported: map[sinktest.Case]string{
			sinktest.Retryable: "the Kafka client retries a broker's refusals (NOT_ENOUGH_REPLICAS, NOT_LEADER, throttling) itself " +
				"and, when it gives the record up, cannot tell that no earlier request of its own wrote it: " +
				"the sink reports those ambiguous (and, having no check, sends again), never retryable",
		},
	})
}
