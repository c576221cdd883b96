package natssink_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks/natssink"
)

// records is a slog.Handler that keeps the records at warning level and above.
type records struct {
	mu   sync.Mutex
	list []slog.Record
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) all() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]slog.Record(nil), r.list...)
}

func attrs(rec slog.Record) map[string]string {
	m := map[string]string{}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

// streamWithWindow makes a stream of its own for the test over prefix.>, with the
// duplicate window window (zero: the server's default, two minutes).
func streamWithWindow(t *testing.T, window time.Duration) string {
	t.Helper()
	_, _, prefix := testutil.Stream(t, natsURL(), "outboxtest_", window)
	return prefix
}

func TestShortDuplicateWindowIsReportedAtOpen(t *testing.T) {
	t.Parallel()
	prefix := streamWithWindow(t, 0)
	s := newSink(t, natssink.Config{Subject: prefix + ".orders", RetrySpan: 24*time.Minute + 18*time.Second})
	logged := &records{}
	s.SetLogger(slog.New(logged))
	require.NoError(t, s.Open(context.Background()), "a short window does not stop the start")

	want := natssink.Shortfall{Stream: prefix, Window: 2 * time.Minute, RetrySpan: 24*time.Minute + 18*time.Second}
	require.Equal(t, []natssink.Shortfall{want}, s.DuplicateWindowShortfalls())
	recs := logged.all()
	require.Len(t, recs, 1)
	require.Equal(t, slog.LevelWarn, recs[0].Level)
	require.Contains(t, recs[0].Message, "duplicate window is shorter than the topic's retry span")
	a := attrs(recs[0])
	require.Equal(t, prefix, a["stream"])
	require.Equal(t, "orders", a["topic"])
	require.Equal(t, "2m0s", a["duplicate_window"])
	require.Equal(t, "24m18s", a["retry_span"])
	require.Contains(t, a["fix"], "nats stream edit "+prefix+" --dupe-window 25m")
	require.Contains(t, a["fix"], "max_attempts or max_interval")

	// Checked once: sends do not warn again.
	require.NoError(t, s.Send(context.Background(), message("order.created", "")))
	require.Len(t, logged.all(), 1)
}

func TestLongEnoughDuplicateWindowIsNotReported(t *testing.T) {
	t.Parallel()
	prefix := streamWithWindow(t, 30*time.Minute)
	for _, subject := range []string{prefix + ".orders", prefix + ".{topic}"} {
		s := newSink(t, natssink.Config{Subject: subject, RetrySpan: 24 * time.Minute})
		logged := &records{}
		s.SetLogger(slog.New(logged))
		require.NoError(t, s.Open(context.Background()))
		require.NoError(t, s.Send(context.Background(), message("order.created", "")))
		require.Empty(t, s.DuplicateWindowShortfalls(), subject)
		require.Empty(t, logged.all(), subject)
	}
}

func TestShortDuplicateWindowOfATemplateIsReportedAtTheFirstPublish(t *testing.T) {
	t.Parallel()
	short, long := streamWithWindow(t, time.Minute), streamWithWindow(t, time.Hour)
	s := newSink(t, natssink.Config{Subject: "{topic}", RetrySpan: 10 * time.Minute})
	logged := &records{}
	s.SetLogger(slog.New(logged))
	require.NoError(t, s.Open(context.Background()))
	require.Empty(t, s.DuplicateWindowShortfalls(), "Open cannot know the streams of a template")

	for range 2 {
		for _, topic := range []string{short + ".a", short + ".b", long + ".a"} {
			require.NoError(t, s.Send(context.Background(), message(topic, "")))
		}
	}
	require.Equal(t, []natssink.Shortfall{{Stream: short, Window: time.Minute, RetrySpan: 10 * time.Minute}}, s.DuplicateWindowShortfalls())
	recs := logged.all()
	require.Len(t, recs, 1, "one warning for the stream, whatever the subjects and sends")
	require.True(t, strings.Contains(attrs(recs[0])["fix"], "--dupe-window 10m"), "%v", attrs(recs[0]))
}

func TestUnknownRetrySpanIsNotChecked(t *testing.T) {
	t.Parallel()
	prefix := streamWithWindow(t, 0)
	s := newSink(t, natssink.Config{Subject: prefix + ".orders"})
	logged := &records{}
	s.SetLogger(slog.New(logged))
	require.NoError(t, s.Open(context.Background()))
	require.NoError(t, s.Send(context.Background(), message("order.created", "")))
	require.Empty(t, s.DuplicateWindowShortfalls())
	require.Empty(t, logged.all())
}
