package rabbitsink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/rabbitsink"
)

// The tests run against a real broker: RABBITMQ_URL, or the local one with the default
// guest account.
func brokerURL() string {
	if u := os.Getenv("RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// broker is a test's own connection to the broker, to set up and inspect what the sink
// publishes to.
type broker struct {
	t    *testing.T
	conn *amqp.Connection
	ch   *amqp.Channel
	name string // a prefix unique to the test
}

func newBroker(t *testing.T) *broker {
	t.Helper()
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		t.Fatalf("cannot connect to RabbitMQ at %s: %v\nstart it with scripts/services.sh (or set RABBITMQ_URL)", redact.URL(brokerURL()), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{t: t, conn: conn, ch: ch, name: "outbox-test-" + uuid.NewString()[:8]}
	t.Cleanup(func() { _ = conn.Close() })
	return b
}

// exchange declares a direct exchange that is deleted when the test ends.
func (b *broker) exchange(name string) string {
	b.t.Helper()
	name = b.name + "-" + name
	if err := b.ch.ExchangeDeclare(name, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { b.cleanup(func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) }) })
	return name
}

// queue declares a queue bound to exchange with each key, deleted when the test ends.
func (b *broker) queue(name, exchange string, args amqp.Table, keys ...string) string {
	b.t.Helper()
	name = b.name + "-" + name
	if _, err := b.ch.QueueDeclare(name, false, false, false, false, args); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() {
		b.cleanup(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name, false, false, false); return err })
	})
	for _, k := range keys {
		if err := b.ch.QueueBind(name, k, exchange, false, nil); err != nil {
			b.t.Fatal(err)
		}
	}
	return name
}

// cleanup runs f on a fresh channel: the test may have closed b.ch with an error.
func (b *broker) cleanup(f func(*amqp.Channel) error) {
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Errorf("cleanup: %v", err)
		return
	}
	defer ch.Close()
	if err := f(ch); err != nil {
		b.t.Errorf("cleanup: %v", err)
	}
}

// depth returns the number of ready messages in queue.
func (b *broker) depth(queue string) int {
	b.t.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}

// newSink builds a sink with the test broker's URL, closed when the test ends.
func newSink(t *testing.T, topic string, cfg rabbitsink.Config) *rabbitsink.Sink {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = brokerURL()
	}
	h, err := rabbitsink.New(topic, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := h.(*rabbitsink.Sink)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func testMessage(topic string, n int) delivery.Message {
	return delivery.Message{
		MessageID: uuid.NewString(),
		Topic:     topic,
		Payload:   json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)),
		Headers:   map[string]string{"X-Row": fmt.Sprint(n)},
		CreatedAt: time.Now().UTC().Truncate(time.Second), // AMQP timestamps are in seconds
		Attempt:   1,
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestConcurrentPublishesAreDeliveredOnceWithProperties(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex := b.exchange("orders")
	topic := b.name + ".order.created"
	q := b.queue("orders", ex, nil, topic)
	s := newSink(t, topic, rabbitsink.Config{Exchange: ex, Headers: map[string]string{"X-Team": "checkout"}})
	ctx := ctxFor(t)
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	port := s.LocalPort()

	const n, workers = 50, 8
	sent := make(map[string]delivery.Message, n)
	work := make(chan delivery.Message)
	for i := range n {
		d := testMessage(topic, i)
		sent[d.MessageID] = d
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d := range work {
				if err := s.Send(ctx, d); err != nil {
					t.Errorf("Send %s: %v", d.MessageID, err)
				}
			}
		})
	}
	for _, d := range sent {
		work <- d
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if got := s.LocalPort(); got != port {
		t.Errorf("the sink reconnected (port %d, then %d): want one connection", port, got)
	}
	if idle := s.IdleChannels(); idle < 1 || idle > workers {
		t.Errorf("%d idle channels after %d concurrent publishers: want 1..%d", idle, workers, workers)
	}

	deliveries, err := b.ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(seen) < n {
		select {
		case m := <-deliveries:
			want, ok := sent[m.MessageId]
			switch {
			case !ok:
				t.Fatalf("unexpected message_id %q", m.MessageId)
			case seen[m.MessageId]:
				t.Fatalf("message %s consumed twice", m.MessageId)
			}
			seen[m.MessageId] = true
			checkMessage(t, m, want)
		case <-timeout:
			t.Fatalf("consumed %d of %d messages", len(seen), n)
		}
	}
	// Every Send returned after the broker's confirm: a duplicate would be queued by now.
	if depth := b.depth(q); depth != 0 {
		t.Errorf("%d more messages in the queue after all %d were consumed", depth, n)
	}
	select {
	case m := <-deliveries:
		t.Errorf("extra delivery %s", m.MessageId)
	default:
	}
}

func checkMessage(t *testing.T, m amqp.Delivery, want delivery.Message) {
	t.Helper()
	id := want.MessageID
	if m.DeliveryMode != amqp.Persistent {
		t.Errorf("%s: delivery mode %d, want persistent", id, m.DeliveryMode)
	}
	if m.ContentType != "application/json" {
		t.Errorf("%s: content type %q", id, m.ContentType)
	}
	if string(m.Body) != string(want.Payload) {
		t.Errorf("%s: body %s, want %s", id, m.Body, want.Payload)
	}
	if !m.Timestamp.Equal(want.CreatedAt) {
		t.Errorf("%s: timestamp %v, want %v", id, m.Timestamp, want.CreatedAt)
	}
	if m.RoutingKey != want.Topic {
		t.Errorf("%s: routing key %q, want the topic %q", id, m.RoutingKey, want.Topic)
	}
	for k, v := range map[string]string{
		sinks.HeaderMessageID: id,
		sinks.HeaderTopic:     want.Topic,
		sinks.HeaderAttempt:   "1",
		sinks.HeaderCreatedAt: want.CreatedAt.Format(time.RFC3339Nano),
		"X-Team":              "checkout",
		"X-Row":               want.Headers["X-Row"],
	} {
		if got, _ := m.Headers[k].(string); got != v {
			t.Errorf("%s: header %s = %v, want %q", id, k, m.Headers[k], v)
		}
	}
}

func TestUnroutableMessageIsPermanentAndNotMisattributed(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex := b.exchange("routed")
	routed, nowhere := b.name+".routed", b.name+".nowhere"
	q := b.queue("routed", ex, nil, routed)
	s := newSink(t, "ignored", rabbitsink.Config{Exchange: ex, RoutingKey: "{topic}"})
	ctx := ctxFor(t)

	err := s.Send(ctx, testMessage(nowhere, 0))
	if !delivery.IsPermanent(err) {
		t.Fatalf("unroutable message: got %v, want a permanent error", err)
	}
	t.Logf("unroutable: %v", err)
	for _, want := range []string{"312 NO_ROUTE", fmt.Sprintf("exchange %q", ex), fmt.Sprintf("routing key %q", nowhere), "routing_key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "guest:") {
		t.Errorf("error shows credentials: %v", err)
	}

	// Routable and unroutable publishes interleaved on the same sink: each gets its own
	// outcome.
	const n = 40
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				topic := routed
				if i%2 == 1 {
					topic = nowhere
				}
				err := s.Send(ctx, testMessage(topic, i))
				switch {
				case topic == routed && err != nil:
					t.Errorf("routable message %d: %v", i, err)
				case topic == nowhere && !delivery.IsPermanent(err):
					t.Errorf("unroutable message %d: got %v, want a permanent error", i, err)
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if depth := b.depth(q); depth != n/2 {
		t.Errorf("queue holds %d messages, want %d", depth, n/2)
	}
}

func TestUnroutableOnDefaultExchange(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	topic := b.name + ".no-such-queue"
	s := newSink(t, topic, rabbitsink.Config{})
	err := s.Send(ctxFor(t), testMessage(topic, 0))
	if !delivery.IsPermanent(err) {
		t.Fatalf("got %v, want a permanent error", err)
	}
	for _, want := range []string{"312 NO_ROUTE", "the default exchange", fmt.Sprintf("declare a queue named %q", topic)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}

	// The default exchange routes by queue name.
	q := b.queue("by-name", "", nil)
	if err := s.Send(ctxFor(t), testMessage(q, 1)); err != nil {
		t.Fatalf("Send to queue %s: %v", q, err)
	}
	if depth := b.depth(q); depth != 1 {
		t.Errorf("queue holds %d messages, want 1", depth)
	}
}

// TestNackIsAmbiguous: a nack may come from one of several queues the message was routed
// to, the others having queued it, so it is not "nothing sent".
func TestNackIsAmbiguous(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex := b.exchange("full")
	// A queue that holds nothing and rejects what overflows it: the broker nacks.
	b.queue("full", ex, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}, "full")
	q := b.queue("ok", ex, nil, "ok")
	s := newSink(t, "t", rabbitsink.Config{Exchange: ex, RoutingKey: "{ordering_key}"})
	ctx := ctxFor(t)

	d := testMessage("t", 0)
	d.OrderingKey = "full"
	err := s.Send(ctx, d)
	if !delivery.IsAmbiguous(err) {
		t.Fatalf("nacked message: got %v, want an ambiguous error", err)
	}
	t.Logf("nack: %v", err)
	if !strings.Contains(err.Error(), "nacked") {
		t.Errorf("error %q does not say the broker nacked", err)
	}
	d = testMessage("t", 1)
	d.OrderingKey = "ok"
	if err := s.Send(ctx, d); err != nil {
		t.Fatalf("Send after a nack: %v", err)
	}
	if depth := b.depth(q); depth != 1 {
		t.Errorf("queue holds %d messages, want 1", depth)
	}
}

func TestMissingExchange(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	missing := b.name + "-missing"
	s := newSink(t, "t", rabbitsink.Config{Exchange: missing})
	err := s.Open(ctxFor(t))
	if err == nil {
		t.Fatal("Open succeeded with a missing exchange")
	}
	t.Logf("Open, missing exchange: %v", err)
	for _, want := range []string{fmt.Sprintf("exchange %q not found", missing), "404", "fix exchange"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error %q does not contain %q", err, want)
		}
	}

	// An exchange deleted after Open: the send fails for good, and the channel the broker
	// closed is not reused once the exchange is back.
	ex := b.exchange("deleted")
	s = newSink(t, "t", rabbitsink.Config{Exchange: ex})
	ctx := ctxFor(t)
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.ch.ExchangeDelete(ex, false, false); err != nil {
		t.Fatal(err)
	}
	err = s.Send(ctx, testMessage("t", 0))
	if !delivery.IsPermanent(err) || !strings.Contains(err.Error(), fmt.Sprintf("exchange %q not found", ex)) {
		t.Fatalf("Send to a deleted exchange: got %v, want a permanent error naming it", err)
	}
	t.Logf("Send, deleted exchange: %v", err)
	b.exchange("deleted")
	q := b.queue("deleted", ex, nil, "t")
	if err := s.Send(ctx, testMessage("t", 1)); err != nil {
		t.Fatalf("Send once the exchange is back: %v", err)
	}
	if depth := b.depth(q); depth != 1 {
		t.Errorf("queue holds %d messages, want 1", depth)
	}
}

func TestUnreachableBroker(t *testing.T) {
	t.Parallel()
	s := newSink(t, "t", rabbitsink.Config{URL: "amqp://user:s3cret@127.0.0.1:1/vhost"})
	ctx := ctxFor(t)
	err := s.Open(ctx)
	if err == nil {
		t.Fatal("Open succeeded with no broker")
	}
	t.Logf("Open, no broker: %v", err)
	if !strings.Contains(err.Error(), "amqp://127.0.0.1:1") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Open error %q: want the redacted URL and no password", err)
	}
	err = s.Send(ctx, testMessage("t", 0))
	if _, ok := delivery.IsRetryable(err); !ok {
		t.Errorf("Send with no broker: got %v, want a retryable error", err)
	}
}

func TestCredentialsFromSettings(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	pass, _ := u.User.Password()
	u.User = nil
	q := b.queue("creds", "", nil)

	s := newSink(t, q, rabbitsink.Config{URL: u.String(), Username: user, Password: pass})
	if err := s.Send(ctxFor(t), testMessage(q, 0)); err != nil {
		t.Fatalf("Send with username and password settings: %v", err)
	}

	s = newSink(t, q, rabbitsink.Config{URL: u.String(), Username: user, Password: "wr0ng-pa55"})
	err = s.Open(ctxFor(t))
	if err == nil {
		t.Fatal("Open succeeded with a wrong password")
	}
	t.Logf("Open, wrong password: %v", err)
	if strings.Contains(err.Error(), "wr0ng-pa55") {
		t.Errorf("Open error shows the password: %v", err)
	}
}

func TestCheckURL(t *testing.T) {
	for _, tc := range []struct {
		url, want string
	}{
		{"", "must be set: the broker's amqp:// or amqps:// URL"},
		{"http://broker:5672/", `must be an amqp:// or amqps:// URL with a host, got "http://broker:5672"`},
		{"amqp://user:s3cret@/vhost", `must be an amqp:// or amqps:// URL with a host, got "(unparsable URL)"`},
		{"broker:5672", `must be an amqp:// or amqps:// URL with a host`},
		{"amqp://user:s3cret@broker/?heartbeat=x", `heartbeat`},
		{"amqp://broker", ""},
		{"amqp://user:12#s3cret@broker:5672/vhost", `percent-encode # (%23)`},
		{"amqp://user:12?s3cret@broker:5672/vhost", `percent-encode # (%23), ? (%3F)`},
		{"amqp://user:12%23s3cret@broker:5672/vhost", ""},
		{"amqp://broker/vhost?heartbeat=10", ""},
		{"amqps://user:s3cret@broker:5671/vhost", ""},
	} {
		err := rabbitsink.CheckURL(tc.url)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckURL(%q): %v", tc.url, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckURL(%q) = %v, want an error containing %q", tc.url, err, tc.want)
		case err != nil && (strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "12")):
			t.Errorf("CheckURL(%q) shows the password: %v", tc.url, err)
		}
	}
}

func TestNewValidation(t *testing.T) {
	missing := t.TempDir() + "/missing-ca.pem"
	for _, tc := range []struct {
		name string
		cfg  rabbitsink.Config
		want []string
	}{
		{"bad scheme", rabbitsink.Config{URL: "nats://user:s3cret@broker:4222"}, []string{"url: must be an amqp:// or amqps:// URL", `"nats://broker:4222"`}},
		{"no url", rabbitsink.Config{}, []string{"url: must be set"}},
		{"bad template", rabbitsink.Config{URL: "amqp://broker", RoutingKey: "orders.{nope}"}, []string{"routing_key:", "{nope}"}},
		{"password alone", rabbitsink.Config{URL: "amqp://broker", Password: "s3cret"}, []string{"username: must be set with password"}},
		{"tls without amqps", rabbitsink.Config{URL: "amqp://broker", TLS: sinks.TLSFiles{ServerName: "broker"}}, []string{"tls:", "amqps://"}},
		{"missing ca", rabbitsink.Config{URL: "amqps://broker", TLS: sinks.TLSFiles{CAFile: missing}}, []string{"tls.ca_file"}},
		{"long exchange", rabbitsink.Config{URL: "amqp://broker", Exchange: strings.Repeat("x", 256)}, []string{"exchange: must be at most 255 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := rabbitsink.New("t", tc.cfg)
			if err == nil {
				t.Fatalf("New succeeded: %#v", h)
			}
			if h != nil {
				t.Errorf("New returned a handler with its error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}

	// New does not connect: a broker that is not there is found by Open or Send.
	h, err := rabbitsink.New("t", rabbitsink.Config{URL: "amqps://127.0.0.1:1", RoutingKey: "{topic}.{ordering_key}"})
	if err != nil {
		t.Fatal(err)
	}
	s := h.(*rabbitsink.Sink)
	defer s.Close()
	// A template that cannot expand fails before any connection is tried.
	if err := s.Send(context.Background(), testMessage("t", 0)); !delivery.IsPermanent(err) || !strings.Contains(err.Error(), "{ordering_key}") {
		t.Errorf("Send without an ordering key: got %v, want a permanent error about {ordering_key}", err)
	}
}

func TestReconnectsAfterTheConnectionBreaks(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("recover", "", nil)
	s := newSink(t, q, rabbitsink.Config{})
	ctx := ctxFor(t)
	if err := s.Send(ctx, testMessage(q, 0)); err != nil {
		t.Fatal(err)
	}

	// Broken under a send that comes at once: at most one failure that is retried (a
	// write error is ambiguous: the connection's writer is shared), marked as a lost
	// connection, then the sink dials again.
	port := s.LocalPort()
	if !s.BreakConnection() {
		t.Fatal("the sink has no connection")
	}
	sent := 1
	if err := s.Send(ctx, testMessage(q, 1)); err != nil {
		if delivery.IsPermanent(err) || !errors.Is(err, delivery.ErrConnectionLost) {
			t.Fatalf("Send on a broken connection: got %v, want success or a failure that is retried, wrapping ErrConnectionLost", err)
		}
		t.Logf("first Send after the break: %v", err)
	} else {
		sent++
	}
	if err := s.Send(ctx, testMessage(q, 2)); err != nil {
		t.Fatalf("second Send after the break: %v", err)
	}
	sent++
	if s.LocalPort() == port {
		t.Errorf("the sink still uses the broken connection")
	}

	// Broken and noticed: the next send reconnects and succeeds.
	s.BreakConnection()
	eventually(t, 5*time.Second, "the sink notices the broken connection", func() bool { return !s.Connected() })
	if err := s.Send(ctx, testMessage(q, 3)); err != nil {
		t.Fatalf("Send after the break was noticed: %v", err)
	}
	sent++
	eventually(t, 5*time.Second, "every sent message is in the queue", func() bool { return b.depth(q) == sent })
}

func TestReconnectsAfterTheBrokerClosesTheConnection(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("rabbitmqctl is not installed: cannot make the broker close a connection")
	}
	if u, err := url.Parse(brokerURL()); err != nil || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
		t.Skip("the broker is not local: rabbitmqctl cannot reach it")
	}
	b := newBroker(t)
	q := b.queue("forced", "", nil)
	s := newSink(t, q, rabbitsink.Config{})
	ctx := ctxFor(t)
	if err := s.Send(ctx, testMessage(q, 0)); err != nil {
		t.Fatal(err)
	}

	// What a broker restart does to its clients: connection.close, 320 CONNECTION_FORCED.
	port := s.LocalPort()
	expr := fmt.Sprintf(`[rabbit_networking:close_connection(P, "outbox test") || P <- rabbit_networking:connections(), rabbit_networking:connection_info(P, [peer_port]) =:= [{peer_port, %d}]].`, port)
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "eval", expr).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("rabbitmqctl eval: %v\n%s", err, out)
	}
	eventually(t, 5*time.Second, "the sink sees the broker close its connection", func() bool { return !s.Connected() })
	if err := s.Send(ctx, testMessage(q, 1)); err != nil {
		t.Fatalf("Send after the broker closed the connection: %v", err)
	}
	if s.LocalPort() == port {
		t.Errorf("the sink still uses the closed connection")
	}
	eventually(t, 5*time.Second, "both messages are in the queue", func() bool { return b.depth(q) == 2 })
}

func TestSendAfterCloseIsRetryable(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("closed", "", nil)
	s := newSink(t, q, rabbitsink.Config{})
	ctx := ctxFor(t)
	if err := s.Send(ctx, testMessage(q, 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	err := s.Send(ctx, testMessage(q, 1))
	if _, ok := delivery.IsRetryable(err); !ok || !errors.Is(err, rabbitsink.ErrClosed) {
		t.Fatalf("Send after Close: got %v, want a retryable ErrClosed", err)
	}
	if err := s.Open(ctx); !errors.Is(err, rabbitsink.ErrClosed) {
		t.Errorf("Open after Close: got %v, want ErrClosed", err)
	}
	if depth := b.depth(q); depth != 1 {
		t.Errorf("queue holds %d messages, want 1", depth)
	}
}

// TestBatchIsPublishedWithConfirms sends a batch the way the batch lane does for a sink
// without a batch publish (delivery.SendAll, 16 at once): every message is confirmed by the
// broker and queued once with its message_id.
func TestBatchIsPublishedWithConfirms(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex := b.exchange("clicks")
	topic := b.name + ".clicks"
	q := b.queue("clicks", ex, nil, topic)
	s := newSink(t, topic, rabbitsink.Config{Exchange: ex})
	ctx := ctxFor(t)
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	batch := make([]delivery.Message, 100)
	for i := range batch {
		batch[i] = testMessage(topic, i)
	}
	for i, err := range delivery.SendAll(ctx, s, batch, 16, 5*time.Second) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	eventually(t, 10*time.Second, "the queue holds the batch", func() bool { return b.depth(q) == len(batch) })
}
