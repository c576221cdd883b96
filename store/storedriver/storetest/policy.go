package storetest

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/storedriver"
)

// testPublishedPolicy pins which published delivery policy is in effect: none at first;
// the first publication; a later file's; not an earlier file's (a process restarted with
// an old file); on a tie of file times, the later publication when its policies differ
// and the recorded one when they are the same; a file time of the Unix epoch, which
// reproducible builds give; concurrent publishers end with the latest file's; and bad
// publications are refused with the value and what is allowed.
func testPublishedPolicy(t *testing.T, h Harness) {
	e := newEnv(t, h)
	none, err := e.d().PublishedPolicy(e.ctx)
	require.NoError(t, err)
	require.Equal(t, storedriver.PublishedPolicy{}, none, "nothing is published on a new deployment")

	base := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("CET", 3600))
	pub := func(doc string, asOf time.Time, by string) storedriver.PublishedPolicy {
		t.Helper()
		got, err := e.d().PublishPolicy(e.ctx, storedriver.PublishedPolicy{Policies: json.RawMessage(doc), AsOf: asOf, By: by})
		require.NoError(t, err)
		return got
	}
	requireInEffect := func(got storedriver.PublishedPolicy, doc string, asOf time.Time, by string) {
		t.Helper()
		require.JSONEq(t, doc, string(got.Policies))
		require.True(t, storedriver.PolicyTime(asOf).Equal(got.AsOf), "as of %s, got %s", storedriver.PolicyTime(asOf), got.AsOf)
		require.Equal(t, time.UTC, got.AsOf.Location())
		require.Equal(t, by, got.By)
		require.WithinDuration(t, time.Now(), got.PublishedAt, time.Minute)
		read, err := e.d().PublishedPolicy(e.ctx)
		require.NoError(t, err)
		require.Equal(t, got, read, "PublishedPolicy reads what PublishPolicy returned")
	}

	v1 := `{"default": {"max_attempts": 5}, "topics": {"orders": {"max_attempts": 3}}}`
	requireInEffect(pub(v1, base, "relay-a (relay.yaml)"), v1, base, "relay-a (relay.yaml)")

	v2 := `{"default": {"max_attempts": 5}, "topics": {"orders": {"max_attempts": 8}}}`
	requireInEffect(pub(v2, base.Add(time.Minute), "worker-b (worker.yaml)"), v2, base.Add(time.Minute), "worker-b (worker.yaml)")

	requireInEffect(pub(v1, base, "relay-a (relay.yaml)"), v2, base.Add(time.Minute), "worker-b (worker.yaml)")
	requireInEffect(pub(v1, base.Add(30*time.Second), "relay-c (relay.yaml)"), v2, base.Add(time.Minute), "worker-b (worker.yaml)")

	before := pub(v2, base.Add(time.Minute), "relay-d (relay.yaml)")
	requireInEffect(before, v2, base.Add(time.Minute), "worker-b (worker.yaml)")

	v3 := `{"default": {"max_attempts": 5}, "topics": {"orders": {"max_attempts": 9}}}`
	requireInEffect(pub(v3, base.Add(time.Minute), "relay-d (relay.yaml)"), v3, base.Add(time.Minute), "relay-d (relay.yaml)")

	epoch := time.Unix(0, 0)
	fresh := newEnv(t, h)
	got, err := fresh.d().PublishPolicy(fresh.ctx, storedriver.PublishedPolicy{Policies: json.RawMessage(v1), AsOf: epoch, By: "built with SOURCE_DATE_EPOCH=0"})
	require.NoError(t, err)
	require.True(t, epoch.Equal(got.AsOf), "as of %s", got.AsOf)

	// Publishers at once, of files changed a second apart: the latest file's is in effect.
	var wg sync.WaitGroup
	latest := base.Add(time.Hour + 7*time.Second)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			doc := `{"default": {"max_attempts": ` + string(rune('1'+i)) + `}}`
			_, err := e.d().PublishPolicy(e.ctx, storedriver.PublishedPolicy{Policies: json.RawMessage(doc), AsOf: base.Add(time.Hour + time.Duration(i)*time.Second), By: "racer"})
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	read, err := e.d().PublishedPolicy(e.ctx)
	require.NoError(t, err)
	require.JSONEq(t, `{"default": {"max_attempts": 8}}`, string(read.Policies))
	require.True(t, storedriver.PolicyTime(latest).Equal(read.AsOf))

	for _, c := range []struct {
		p    storedriver.PublishedPolicy
		want string
	}{
		{storedriver.PublishedPolicy{Policies: json.RawMessage(`{"default": `), AsOf: base, By: "x"}, `policies must be a JSON object, got "{\"default\": "`},
		{storedriver.PublishedPolicy{Policies: json.RawMessage(`[1]`), AsOf: base, By: "x"}, `policies must be a JSON object, got "[1]"`},
		{storedriver.PublishedPolicy{Policies: json.RawMessage(`{}`), By: "x"}, "as of must be the time the configuration last changed, got the zero time"},
		{storedriver.PublishedPolicy{Policies: json.RawMessage(`{}`), AsOf: base, By: " "}, `by must be 1 to 500 bytes of text without NUL naming the process and its file, got " "`},
	} {
		_, err := e.d().PublishPolicy(e.ctx, c.p)
		require.Error(t, err)
		require.Contains(t, err.Error(), c.want)
	}
	read2, err := e.d().PublishedPolicy(e.ctx)
	require.NoError(t, err)
	require.Equal(t, read, read2, "a refused publication changes nothing")
}
