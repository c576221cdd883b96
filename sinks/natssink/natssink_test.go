package natssink_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/sinks/natssink"
)

// natsURL is the local server scripts/services.sh starts (NATS_URL overrides it).
func natsURL() string { return cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222") }

// stream makes a stream of its own for the test over prefix.>, removed afterwards.
func stream(t *testing.T) (jetstream.JetStream, jetstream.Stream, string) {
	t.Helper()
	return testutil.Stream(t, natsURL(), "outboxtest_", time.Minute)
}

func newSink(t *testing.T, cfg natssink.Config) *natssink.Sink {
	t.Helper()
	cfg.URL = cmp.Or(cfg.URL, natsURL())
	h, err := natssink.New("orders", cfg)
	require.NoError(t, err)
	s := h.(*natssink.Sink)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func message(topic, key string) delivery.Message {
	id := uuid.New()
	return delivery.Message{
		MessageID: id.String(), Topic: topic, OrderingKey: key, Attempt: 1, MaxAttempts: 12,
		Payload: json.RawMessage(fmt.Sprintf(`{"id":%q}`, id)), Headers: map[string]string{"tenant": "t1"},
		CreatedAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
	}
}

// fetchAll reads the stream's messages from the start.
func fetchAll(t *testing.T, st jetstream.Stream, want int) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var got []jetstream.Msg
	for len(got) < want {
		batch, err := cons.Fetch(want-len(got), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			got = append(got, m)
			n++
		}
		require.NotZero(t, n, "the stream holds %d of %d messages", len(got), want)
	}
	return got
}

func TestSendDeliversEachMessageOnce(t *testing.T) {
	t.Parallel()
	_, st, prefix := stream(t)
	s := newSink(t, natssink.Config{Subject: prefix + ".{topic}", Headers: map[string]string{"source": "outbox"}})
	require.NoError(t, s.Open(context.Background()))

	const n = 50
	sent := map[string]delivery.Message{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		d := message("order.created", fmt.Sprintf("k%d", i%5))
		sent[d.MessageID] = d
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Send(context.Background(), d)
			mu.Lock()
			defer mu.Unlock()
			require.NoError(t, err)
		}()
	}
	wg.Wait()

	seen := map[string]bool{}
	for _, m := range fetchAll(t, st, n) {
		h := m.Headers()
		id := h.Get(jetstream.MsgIDHeader)
		require.Equal(t, id, h.Get(sinks.HeaderMessageID))
		d, ok := sent[id]
		require.True(t, ok, "unknown message %s", id)
		require.False(t, seen[id], "message %s seen twice", id)
		seen[id] = true
		require.Equal(t, prefix+".order.created", m.Subject())
		require.JSONEq(t, string(d.Payload), string(m.Data()))
		require.Equal(t, "order.created", h.Get(sinks.HeaderTopic))
		require.Equal(t, d.OrderingKey, h.Get(sinks.HeaderOrderingKey))
		require.Equal(t, "t1", h.Get("tenant"))
		require.Equal(t, "outbox", h.Get("source"))
		require.Equal(t, "2026-12-01T10:00:00Z", h.Get(sinks.HeaderCreatedAt))
	}
	require.Len(t, seen, n)
}

func TestResendInsideDuplicateWindowIsAbsorbed(t *testing.T) {
	t.Parallel()
	_, st, prefix := stream(t)
	s := newSink(t, natssink.Config{Subject: prefix + ".{ordering_key}"})
	d := message("order.created", "customer-7")
	require.NoError(t, s.Send(context.Background(), d))
	d.Attempt = 2
	require.NoError(t, s.Send(context.Background(), d), "a resend counts as delivered")

	info, err := st.Info(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "the stream stored the message once")
	got := fetchAll(t, st, 1)
	require.Equal(t, prefix+".customer-7", got[0].Subject())
}

func TestMissingStreamIsPermanent(t *testing.T) {
	t.Parallel()
	subject := "outboxtest_nostream_" + uuid.NewString()[:8]
	s := newSink(t, natssink.Config{Subject: subject})
	err := s.Open(context.Background())
	require.ErrorContains(t, err, fmt.Sprintf("no JetStream stream captures subject %q", subject))

	err = s.Send(context.Background(), message("order.created", ""))
	require.Error(t, err)
	require.True(t, delivery.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, subject)
}

func TestSubjectFromTemplate(t *testing.T) {
	t.Parallel()
	_, _, prefix := stream(t)
	s := newSink(t, natssink.Config{Subject: prefix + ".{ordering_key}"})

	err := s.Send(context.Background(), message("order.created", ""))
	require.True(t, delivery.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, "has no ordering key")

	err = s.Send(context.Background(), message("order.created", "a b"))
	require.True(t, delivery.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, "white space")

	err = s.Send(context.Background(), message("order.created", "a..b"))
	require.True(t, delivery.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, "empty token")

	d := message("order.created", "k")
	d.Headers = map[string]string{"bad header": "x"}
	err = s.Send(context.Background(), d)
	require.True(t, delivery.IsPermanent(err), "%v", err)
	require.ErrorContains(t, err, `header "bad header"`)
}

func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	s := newSink(t, natssink.Config{URL: "nats://user:hunter2@127.0.0.1:1"})
	err := s.Open(context.Background())
	require.ErrorContains(t, err, "connect to nats nats://127.0.0.1:1")
	require.NotContains(t, err.Error(), "hunter2")

	err = s.Send(context.Background(), message("order.created", ""))
	_, retryable := delivery.IsRetryable(err)
	require.True(t, retryable, "%v", err)
}

func TestSendAfterCloseIsRetryable(t *testing.T) {
	t.Parallel()
	_, _, prefix := stream(t)
	s := newSink(t, natssink.Config{Subject: prefix + ".x"})
	require.NoError(t, s.Open(context.Background()))
	require.NoError(t, s.Close())
	_, retryable := delivery.IsRetryable(s.Send(context.Background(), message("order.created", "")))
	require.True(t, retryable)
}

func TestNewRefusesBadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  natssink.Config
		want string
	}{
		{natssink.Config{}, "url: must be set"},
		{natssink.Config{URL: "http://127.0.0.1:4222"}, "url: must be nats://host:port"},
		{natssink.Config{URL: "nats://u:secret@h:1,ftp://h:2"}, `got "nats://h:1,ftp://h:2"`},
		{natssink.Config{URL: "nats://h:1", Subject: "a.{nope}"}, "subject: unknown placeholder {nope}"},
		{natssink.Config{URL: "nats://h:1", TLS: sinks.TLSFiles{CAFile: "/nonexistent/ca.pem"}}, "tls.ca_file"},
		{natssink.Config{URL: "nats://h:1", Headers: map[string]string{"X-Region/Zone": "eu"}}, `headers: "X-Region/Zone" is not a header name NATS carries`},
	} {
		_, err := natssink.New("orders", tc.cfg)
		require.ErrorContains(t, err, tc.want)
		require.NotContains(t, err.Error(), "secret")
	}
}

// TestSendBatchPublishesTogether publishes a batch with one asynchronous publish per
// message against the real server: each message once with its Nats-Msg-Id, a resend of
// the batch absorbed by the duplicate window, and a message whose subject the template
// cannot make failed alone.
func TestSendBatchPublishesTogether(t *testing.T) {
	t.Parallel()
	_, st, prefix := stream(t)
	s := newSink(t, natssink.Config{Subject: prefix + ".{ordering_key}"})
	var _ delivery.BatchHandler = s
	var batch []delivery.Message
	for i := range 100 {
		batch = append(batch, message("clicks", fmt.Sprintf("k%d", i%7)))
	}
	batch[42].OrderingKey = "" // {ordering_key} of a message without one: permanent
	errs := s.SendBatch(context.Background(), batch)
	require.Len(t, errs, 100)
	for i, err := range errs {
		if i == 42 {
			require.True(t, delivery.IsPermanent(err), "%v", err)
			continue
		}
		require.NoError(t, err, "message %d", i)
	}
	for _, d := range batch {
		d.Attempt = 2
	}
	for i, err := range s.SendBatch(context.Background(), batch) {
		if i != 42 {
			require.NoError(t, err, "a resend counts as delivered")
		}
	}
	info, err := st.Info(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 99, info.State.Msgs, "the stream stored each message once")
	seen := map[string]bool{}
	for _, m := range fetchAll(t, st, 99) {
		seen[m.Headers().Get(jetstream.MsgIDHeader)] = true
	}
	require.Len(t, seen, 99)

	// An attempt that ends before its acknowledgements leaves those messages ambiguous.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range s.SendBatch(ctx, batch[:3]) {
		require.True(t, err == nil || delivery.IsAmbiguous(err), "%v", err)
	}
}

// TestHeadersOverJetStreamsLimit sends a message whose headers exceed the 64 KiB a
// JetStream stream takes (error code 10097): no retry can store it, so the send fails
// permanently, and the message is dead-lettered at once instead of after its attempts.
func TestHeadersOverJetStreamsLimit(t *testing.T) {
	t.Parallel()
	_, _, prefix := stream(t)
	s := newSink(t, natssink.Config{Subject: prefix + ".{topic}"})
	m := message("orders", "")
	m.Headers = map[string]string{"baggage": strings.Repeat("x", 70<<10)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.Send(ctx, m)
	require.True(t, delivery.IsPermanent(err), "%v (%v)", err, delivery.KindOf(err))
	require.ErrorContains(t, err, "err_code=10097")
}
