package natssink_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/natssink"
	"github.com/outbox-go/outbox/sinks/sinktest"
)

// conformanceJS is a test's own JetStream connection, to set up and read the streams the
// sink publishes to.
func conformanceJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(natsURL())
	if err != nil {
		t.Fatalf("NATS with JetStream must run at %s: run scripts/services.sh: %v", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// conformanceStream is a stream of the test's own over prefix.>, changed by edit, removed
// when the test ends; it returns the subject the sink publishes to.
func conformanceStream(t *testing.T, js jetstream.JetStream, edit func(*jetstream.StreamConfig)) (name, subject string) {
	t.Helper()
	name = "outboxtest_conf_" + uuid.NewString()[:8]
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Duplicates: time.Minute}
	if edit != nil {
		edit(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := testutil.CreateStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return name, name + ".events"
}

// streamReceived reads what stream holds for the message id: every message, by sequence.
func streamReceived(js jetstream.JetStream, stream string) func(t *testing.T, id string) []sinktest.Received {
	return func(t *testing.T, id string) []sinktest.Received {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatalf("stream %s: %v", stream, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []sinktest.Received
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				t.Fatalf("stream %s, message %d: %v", stream, seq, err)
			}
			if m.Header.Get(sinks.HeaderMessageID) != id && m.Header.Get(jetstream.MsgIDHeader) != id {
				continue
			}
			headers := map[string]string{}
			for k := range m.Header {
				headers[k] = m.Header.Get(k)
			}
			// Nats-Msg-Id is what the stream de-duplicates by; Outbox-Message-Id must agree.
			key := m.Header.Get(jetstream.MsgIDHeader)
			if other := m.Header.Get(sinks.HeaderMessageID); other != key {
				key = fmt.Sprintf("%s %q, %s %q", jetstream.MsgIDHeader, key, sinks.HeaderMessageID, other)
			}
			out = append(out, sinktest.Received{Payload: m.Data, IdempotencyKey: key, Attempt: m.Header.Get(sinks.HeaderAttempt), Headers: headers})
		}
		return out
	}
}

// conformanceSink builds a sink, closed when the test ends.
func conformanceSink(t *testing.T, cfg natssink.Config) *natssink.Sink {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = natsURL()
	}
	h, err := natssink.New("orders", cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := h.(*natssink.Sink)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// natsHost is the host:port of the test server.
func natsHost(t *testing.T) string {
	u, err := url.Parse(natsURL())
	if err != nil || u.Host == "" {
		t.Fatalf("NATS_URL %q: want nats://host:port", natsURL())
	}
	return u.Host
}

// TestConformance runs the sink conformance suite against the NATS JetStream server of
// scripts/services.sh (NATS_URL), each case on a stream of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Name:           "nats",
		CarriesAttempt: true,
		// A publish whose connection broke waits for its ack until the attempt ends.
		SendTimeout: 8 * time.Second,
		New: func(t *testing.T) sinktest.Target {
			js := conformanceJS(t)
			stream, subject := conformanceStream(t, js, nil)
			return sinktest.Target{Handler: conformanceSink(t, natssink.Config{Subject: subject}), Received: streamReceived(js, stream)}
		},
		// A stream that is full and discards new messages answers the publish with an
		// error, and stores nothing.
		Refuse: func(t *testing.T) sinktest.Target {
			js := conformanceJS(t)
			stream, subject := conformanceStream(t, js, func(c *jetstream.StreamConfig) {
				c.MaxMsgs, c.Discard = 1, jetstream.DiscardNew
			})
			if _, err := js.Publish(context.Background(), subject, []byte(`{"fill":1}`)); err != nil {
				t.Fatal(err)
			}
			return sinktest.Target{Handler: conformanceSink(t, natssink.Config{Subject: subject}), Received: streamReceived(js, stream)}
		},
		// No stream captures the subject.
		Reject: func(t *testing.T) sinktest.Target {
			subject := "outboxtest_nostream_" + uuid.NewString()[:8] + ".events"
			return sinktest.Target{Handler: conformanceSink(t, natssink.Config{Subject: subject})}
		},
		// The publish reaches the server through a proxy that holds back the stream's ack.
		Stall: func(t *testing.T) sinktest.Stalled {
			js := conformanceJS(t)
			stream, subject := conformanceStream(t, js, nil)
			p := sinktest.NewProxy(t, natsHost(t))
			s := conformanceSink(t, natssink.Config{URL: "nats://" + p.Addr(), Subject: subject})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.Open(ctx); err != nil {
				t.Fatalf("Open through the proxy: %v", err)
			}
			p.Hold()
			return sinktest.Stalled{Target: sinktest.Target{Handler: s, Received: streamReceived(js, stream)}, Cut: p.Cut}
		},
		WithSecret: func(t *testing.T, secret string) []delivery.Handler {
			host := natsHost(t)
			nostream := "outboxtest_nostream_" + uuid.NewString()[:8] + ".events"
			return []delivery.Handler{
				// Nothing listens.
				conformanceSink(t, natssink.Config{URL: "nats://outbox:" + secret + "@127.0.0.1:1"}),
				conformanceSink(t, natssink.Config{URL: "nats://outbox:" + secret + "@127.0.0.1:1, nats://" + secret + "@127.0.0.1:2"}),
				conformanceSink(t, natssink.Config{URL: "nats://127.0.0.1:1", Username: "outbox", Password: secret}),
				// The live server, a subject no stream captures.
				conformanceSink(t, natssink.Config{URL: "nats://" + host, Username: "outbox", Password: secret, Subject: nostream}),
				conformanceSink(t, natssink.Config{URL: "nats://outbox:" + secret + "@" + host, Subject: nostream}),
				// A URL the client cannot parse (a stray % in the password).
				conformanceSink(t, natssink.Config{URL: "nats://outbox:" + secret + "%zz@" + host, Subject: nostream}),
				conformanceSink(t, natssink.Config{URL: " nats://outbox:" + secret + "@" + host + " ", Subject: nostream}),
			}
		},
		BadConfig: func(secret string) []error {
			var errs []error
			for _, cfg := range []natssink.Config{
				{URL: "http://outbox:" + secret + "@nats:4222"},
				{URL: "nats://outbox:" + secret + "@nats:1,ftp://nats:2"},
				{URL: "nats://outbox:" + secret + "@nats:4222/" + secret},
				{URL: "nats://outbox:" + secret + "@nats:4222", Subject: "orders.{nope}"},
				{URL: "nats://outbox:" + secret + "@nats:4222", Password: secret, TLS: sinks.TLSFiles{CAFile: "/nonexistent/ca.pem"}},
				{URL: "nats://" + secret + "@nats:4222", Headers: map[string]string{"Nats-Rollup": "all"}},
			} {
				_, err := natssink.New("orders", cfg)
				errs = append(errs, err)
			}
			return errs
		},
	})
}
