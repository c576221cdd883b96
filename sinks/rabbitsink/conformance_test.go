package rabbitsink_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/rabbitsink"
	"github.com/outbox-go/outbox/sinks/sinktest"
)

// conformanceRoutingKey is the routing key of the sinks the conformance harness builds.
const conformanceRoutingKey = "events"

// conformanceDest is a direct exchange of the test's own with one queue bound to it by
// conformanceRoutingKey, both deleted when the test ends, and what was taken off the queue.
type conformanceDest struct {
	conn     *amqp.Connection
	exchange string
	queue    string

	mu   sync.Mutex
	got  []amqp.Delivery
	read *amqp.Channel
}

func newConformanceDest(t *testing.T) *conformanceDest {
	t.Helper()
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		t.Fatalf("cannot connect to RabbitMQ at %s: %v\nstart it with scripts/services.sh (or set RABBITMQ_URL)", redact.URL(brokerURL()), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	name := "outbox-conf-" + uuid.NewString()[:8]
	d := &conformanceDest{conn: conn, exchange: name, queue: name, read: ch}
	if err := ch.ExchangeDeclare(name, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, conformanceRoutingKey, name, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer ch.Close()
		if _, err := ch.QueueDelete(name, false, false, false); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := ch.ExchangeDelete(name, false, false); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return d
}

// received takes what the queue holds off it, and returns every message taken so far
// with the message ID id.
func (d *conformanceDest) received(t *testing.T, id string) []sinktest.Received {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		m, ok, err := d.read.Get(d.queue, true)
		if err != nil {
			t.Fatalf("get from queue %s: %v", d.queue, err)
		}
		if !ok {
			break
		}
		d.got = append(d.got, m)
	}
	var out []sinktest.Received
	for _, m := range d.got {
		if m.MessageId != id && m.Headers[sinks.HeaderMessageID] != id {
			continue
		}
		headers := map[string]string{}
		for k, v := range m.Headers {
			headers[k] = fmt.Sprint(v)
		}
		// message_id is the AMQP property consumers de-duplicate by; Outbox-Message-Id
		// must agree.
		key := m.MessageId
		if other := headers[sinks.HeaderMessageID]; other != key {
			key = fmt.Sprintf("message_id %q, %s %q", key, sinks.HeaderMessageID, other)
		}
		out = append(out, sinktest.Received{Payload: m.Body, IdempotencyKey: key, Attempt: headers[sinks.HeaderAttempt], Headers: headers})
	}
	return out
}

// withHost returns the broker's URL with host (host:port) in place of the broker's.
func withHost(t *testing.T, host string) string {
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host
	return u.String()
}

func brokerHost(t *testing.T) string {
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "5672")
	}
	return u.Host
}

// TestConformance runs the sink conformance suite against the RabbitMQ broker of
// scripts/services.sh (RABBITMQ_URL), each case on an exchange and a queue of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Name:           "rabbitmq",
		CarriesAttempt: true,
		New: func(t *testing.T) sinktest.Target {
			d := newConformanceDest(t)
			s := newSink(t, "orders", rabbitsink.Config{Exchange: d.exchange, RoutingKey: conformanceRoutingKey})
			return sinktest.Target{Handler: s, Received: d.received}
		},
		// The broker refuses the connection: a virtual host it does not have.
		Refuse: func(t *testing.T) sinktest.Target {
			u, err := url.Parse(brokerURL())
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/outbox-conf-novhost-" + uuid.NewString()[:8]
			d := newConformanceDest(t)
			s := newSink(t, "orders", rabbitsink.Config{URL: u.String(), Exchange: d.exchange, RoutingKey: conformanceRoutingKey})
			return sinktest.Target{Handler: s, Received: d.received}
		},
		// An exchange that does not exist.
		Reject: func(t *testing.T) sinktest.Target {
			s := newSink(t, "orders", rabbitsink.Config{Exchange: "outbox-conf-missing-" + uuid.NewString()[:8], RoutingKey: conformanceRoutingKey})
			return sinktest.Target{Handler: s}
		},
		// The publish reaches the broker through a proxy that holds back its confirm.
		Stall: func(t *testing.T) sinktest.Stalled {
			d := newConformanceDest(t)
			p := sinktest.NewProxy(t, brokerHost(t))
			s := newSink(t, "orders", rabbitsink.Config{URL: withHost(t, p.Addr()), Exchange: d.exchange, RoutingKey: conformanceRoutingKey})
			// Broken before the sink's Close, which would wait for the held close-ok, and
			// noticed by it first.
			t.Cleanup(func() {
				p.Close()
				eventually(t, 5*time.Second, "the sink sees its connection broken", func() bool { return !s.Connected() })
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.Open(ctx); err != nil {
				t.Fatalf("Open through the proxy: %v", err)
			}
			p.Hold()
			return sinktest.Stalled{Target: sinktest.Target{Handler: s, Received: d.received}, Cut: p.Cut}
		},
		WithSecret: func(t *testing.T, secret string) []delivery.Handler {
			u, err := url.Parse(brokerURL())
			if err != nil {
				t.Fatal(err)
			}
			user := u.User.Username()
			wrong := *u
			wrong.User = url.UserPassword(user, secret)
			bare := *u
			bare.User = nil
			return []delivery.Handler{
				// The broker refuses the password.
				newSink(t, "orders", rabbitsink.Config{URL: wrong.String()}),
				newSink(t, "orders", rabbitsink.Config{URL: bare.String(), Username: user, Password: secret}),
				// Nothing listens.
				newSink(t, "orders", rabbitsink.Config{URL: "amqp://outbox:" + secret + "@127.0.0.1:1/" + secret}),
				newSink(t, "orders", rabbitsink.Config{URL: "amqp://127.0.0.1:1/", Username: "outbox", Password: secret}),
			}
		},
		BadConfig: func(secret string) []error {
			var errs []error
			for _, cfg := range []rabbitsink.Config{
				{URL: "nats://outbox:" + secret + "@broker:5672/"},
				{URL: "amqp://outbox:" + secret + "@broker/?heartbeat=x"},
				{URL: "amqp://outbox:" + secret + "@/vhost"},
				{URL: "amqp://outbox:" + secret + "#@broker:5672/"},
				{URL: "amqp://broker", Password: secret},
				{URL: "amqp://outbox:" + secret + "@broker", TLS: sinks.TLSFiles{ServerName: "broker"}},
				{URL: "amqps://outbox:" + secret + "@broker", TLS: sinks.TLSFiles{CAFile: "/nonexistent/ca.pem"}},
			} {
				_, err := rabbitsink.New("orders", cfg)
				errs = append(errs, err)
			}
			return errs
		},
	})
}
