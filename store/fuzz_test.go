package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// fuzzPayloadLimit is small so that fuzzed payloads reach the size check.
const fuzzPayloadLimit = 1024

// validationFields are the fields a *store.ValidationError may name.
var validationFields = []string{"topic", "payload", "headers", "max_retry_times", "ordering_key", "deliver_after"}

// FuzzValidate checks message validation: it never panics, returns nil or a
// *store.ValidationError naming a known field, and what it accepts satisfies the
// documented rules. When the test database is reachable, an accepted message must also
// be accepted by PostgreSQL (inserted in a transaction that is rolled back), and its
// payload read back must be within the limit as a send measures it.
func FuzzValidate(f *testing.F) {
	for _, s := range []struct {
		topic       string
		payload     string
		headerKey   string
		headerValue string
		orderingKey string
		maxRetry    int
		setRetry    bool
	}{
		{"order.created", `{"id": 1}`, "traceparent", "00-abc", "", 0, false},
		{"order.created", `"just a string"`, "", "", "", 3, true},
		{"a", `42`, "", "", "order-7", 0, true},
		{"", `{}`, "", "", "", 0, false},
		{"Order Created", `{}`, "", "", "", 0, false},
		{strings.Repeat("a", 201), `{}`, "", "", "", 0, false},
		{"a", ``, "", "", "", 0, false},
		{"a", `   `, "", "", "", 0, false},
		{"a", `{"a":`, "", "", "", 0, false},
		{"a", `{"a": "x\u0000y"}`, "", "", "", 0, false},
		{"a", `{"\u0000": 1}`, "", "", "", 0, false},
		{"a", `{"path": "C:\\u0000dir"}`, "", "", "", 0, false},
		{"a", `{"s": "\\\u0000"}`, "", "", "", 0, false},
		{"a", `{"s": "` + strings.Repeat("x", fuzzPayloadLimit) + `"}`, "", "", "", 0, false},
		{"a", `{"e": "😀 e\u0301 שלום \u2028"}`, "", "", "", 0, false},
		{"a", `{}`, "", "v", "", 0, false},
		{"a", `{}`, "k", "a\x00b", "", 0, false},
		{"a", `{}`, "", "", "   ", 0, false},
		{"a", `{}`, "", "", strings.Repeat("k", 201), 0, false},
		{"a", `{}`, "", "", "k\x00", 0, false},
		{"a", `{}`, "", "", "", -1, true},
		{"a", `{}`, "", "", "", 100, true},
		{"a", `{}`, "", "", "", 101, true},
		{"a", `{} {}`, "", "", "", 0, false},
		{"a", `[1, 2, {"select": null}]`, "", "", "", 0, false},
		// What JSON allows and jsonb refuses.
		{"a", `{"s": "\ud800"}`, "", "", "", 0, false},
		{"a", `{"s": "\udc00x"}`, "", "", "", 0, false},
		{"a", `{"s": "\ud83d\ude00"}`, "", "", "", 0, false},
		{"a", `1e1000000`, "", "", "", 0, false},
		{"a", `1e131071`, "", "", "", 0, false},
		{"a", `0.1e-16382`, "", "", "", 0, false},
		{"a", `0e99999999`, "", "", "", 0, false},
		{"a", `0e9999999999`, "", "", "", 0, false},
		{"a", `{"n": 0e-20000}`, "", "", "", 0, false},
		{"a", `{"n": 0.0e-16383}`, "", "", "", 0, false},
		{"a", `{"n": 0e-16383}`, "", "", "", 0, false},
		{"a", `{"n": 1.5e-16383}`, "", "", "", 0, false},
		{"a", `{"n": 0e1000001}`, "", "", "", 0, false},
		// What jsonb prints longer than it was written.
		{"a", `[1e1021]`, "", "", "", 0, false},
		{"a", `[1e1022]`, "", "", "", 0, false},
		{"a", `{"n":1.5e-900}`, "", "", "", 0, false},
		{"a", "[" + strings.Repeat("1,", fuzzPayloadLimit/2-2) + "1]", "", "", "", 0, false},
		{"a", `{}`, "", "", "order\n42", 0, false},
		{"a", `{}`, "", "", "tenant\x01", 0, false},
		{"a", "{\"s\": \"\xff\"}", "", "", "", 0, false},
		{"a", `{}`, "", "", "k\xffk", 0, false},
	} {
		f.Add(s.topic, []byte(s.payload), s.headerKey, s.headerValue, s.orderingKey, s.maxRetry, s.setRetry)
	}

	st, err := store.New(nil, store.Config{MaxPayloadBytes: fuzzPayloadLimit})
	require.NoError(f, err)
	pool, pgStore := fuzzDB(f)

	f.Fuzz(func(t *testing.T, topic string, payload []byte, headerKey, headerValue, orderingKey string, maxRetry int, setRetry bool) {
		msg := store.Message{Topic: topic, Payload: payload, OrderingKey: orderingKey}
		if headerKey != "" || headerValue != "" {
			msg.Headers = map[string]string{headerKey: headerValue}
		}
		if setRetry {
			msg.MaxRetryTimes = &maxRetry
		}
		err := st.Validate(msg)
		if err != nil {
			verr, ok := err.(*store.ValidationError)
			require.True(t, ok, "want a *store.ValidationError, got %T: %v", err, err)
			require.Contains(t, validationFields, verr.Field)
			require.NotEmpty(t, verr.Reason)
			require.Contains(t, err.Error(), verr.Field)
			return
		}

		// Accepted: the documented rules hold.
		require.Regexp(t, store.TopicPattern, topic)
		require.LessOrEqual(t, len(payload), fuzzPayloadLimit)
		require.True(t, json.Valid(payload), "payload %q", payload)
		require.False(t, hasNUL(t, payload), "payload %q has a NUL", payload)
		require.LessOrEqual(t, len(orderingKey), 200)
		require.False(t, strings.ContainsFunc(orderingKey, func(r rune) bool { return r < 0x20 || r == 0x7f }),
			"ordering key %q has a control character (it travels as a header)", orderingKey)
		if setRetry {
			require.True(t, maxRetry >= 0 && maxRetry <= store.MaxRetryTimesLimit, "max_retry_times %d", maxRetry)
		}

		if pool == nil {
			return
		}
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		id, err := pgStore.Enqueue(ctx, tx, msg)
		if err != nil {
			t.Fatalf("Validate accepted %+v but Enqueue failed: %v", msg, err)
		}
		// What jsonb prints back is within the limit as a send measures it.
		var stored []byte
		require.NoError(t, tx.QueryRow(ctx, `SELECT payload::text FROM `+pgStore.Schema()+`.outbox_messages WHERE message_id = $1`, id).Scan(&stored))
		require.LessOrEqual(t, store.PayloadSize(stored), fuzzPayloadLimit, "payload %q is stored as %q", payload, stored)
	})
}

// hasNUL reports whether a JSON document holds a NUL in any key or string.
func hasNUL(t *testing.T, doc []byte) bool {
	var v any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber() // numbers beyond float64 are valid JSON
	require.NoError(t, dec.Decode(&v))
	var walk func(any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case string:
			return strings.ContainsRune(v, 0)
		case []any:
			return slices.ContainsFunc(v, walk)
		case map[string]any:
			for k, e := range v {
				if strings.ContainsRune(k, 0) || walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// fuzzDB returns a pool and a store on a fresh schema of the test database, or nils when
// the database cannot be reached (the PostgreSQL half of FuzzValidate is then skipped).
func fuzzDB(f *testing.F) (*pgxpool.Pool, *store.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testdb.URL())
	if err != nil {
		f.Logf("PostgreSQL at %s not reachable, checking validation only: %v", testdb.URL(), err)
		return nil, nil
	}
	_ = conn.Close(ctx)
	return testdb.Schema(f)
}

// FuzzParseHeaders checks the decoding of the headers column, which other programs may
// fill with any JSON: it never panics, returns nil for anything but a JSON object, and
// returns exactly the object's string-valued entries.
func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{
		`{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=b"}`,
		`["traceparent", "00-abc"]`,
		`"traceparent"`,
		`42`,
		`null`,
		`true`,
		`{}`,
		`{"a": 1, "b": "two", "c": null, "d": {"e": "f"}, "g": ["h"]}`,
		`{"a": "x", "a": "y"}`,
		`{"é": "😀", "": "empty key", "k": "\u2028"}`,
		`{"a": "\ud800"}`,
		`{"a": "b"`,
		``,
		`   `,
		"\xff\xfe",
		`{"a": "b"} trailing`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := store.ParseHeaders(data)
		var obj map[string]any
		if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
			require.Nil(t, got, "not a JSON object: %q", data)
			return
		}
		want := map[string]string{}
		for k, v := range obj {
			if s, ok := v.(string); ok {
				want[k] = s
			}
		}
		if len(want) == 0 {
			require.Nil(t, got)
			return
		}
		require.True(t, maps.Equal(want, got), "ParseHeaders(%q) = %v, want %v", data, got, want)
	})
}
