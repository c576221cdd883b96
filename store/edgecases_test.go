package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestEnqueueEdgeCaseText enqueues text that trips up hand-built SQL and naive JSON
// handling (quotes, backslashes, line separators, emoji, combining marks, right-to-left
// text, SQL keywords) and reads it back unchanged. Payloads are compared as decoded JSON:
// jsonb reorders keys and normalises escapes. A real \u0000 escape is rejected by
// Enqueue; TestEnqueue/ValidationErrorsNameFieldAndValueAndWriteNothing covers it.
func TestEnqueueEdgeCaseText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)

	t.Run("Payloads", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ name, payload string }{
			{"SingleQuote", `{"s": "it's", "sql": "'; DROP TABLE outbox_messages; --"}`},
			{"DoubleQuote", `{"s": "say \"hi\"", "\"quoted key\"": 1}`},
			{"Backslash", `{"s": "C:\\dir\\file", "two": "\\\\", "trailing": "x\\"}`},
			{"LineAndParagraphSeparators", "{\"raw\": \"a\u2028b\u2029c\", \"escaped\": \"a\\u2028b\\u2029c\"}"},
			{"Emoji", `{"s": "📦🚚✅", "flag": "🇩🇪", "family": "👩‍👩‍👧"}`},
			{"FourByteUTF8", `{"s": "𝄞 𠜎 😀", "escaped": "\ud834\udd1e\ud83d\ude00"}`},
			{"CombiningMarks", "{\"s\": \"e\u0301 n\u0303 Z\u0351\u0352\u0353\", \"nfc\": \"é\"}"},
			{"RightToLeft", "{\"he\": \"שלום עולם\", \"ar\": \"مرحبا بالعالم\", \"mixed\": \"abc \u202eDEF\u202c ghi\"}"},
			{"LiteralBackslashU0000", `{"s": "\\u0000", "path": "C:\\u0000dir", "\\u0000key": "v"}`},
			{"ControlEscapes", `{"s": "tab\there\nnewline\r\u0001\u001f\b\f"}`},
			{"SQLKeywordKeys", `{"select": 1, "from": "where", "drop table": null, "null": "NULL", "true": false, "order by": ["asc", "desc"], "$1": "?"}`},
			{"Nested", `{"a": [{"'": "\""}, {"\\": ["😀", "\u2028"]}], "b": {"c": {"d": "e\u0301"}}}`},
			{"TopLevelString", `"it's \"quoted\" \\ 😀"`},
			{"TopLevelArray", `["'", "\"", "\\", "\u2028", "😀"]`},
			{"UnicodeEscapesOfAscii", `{"\u0061": "\u0062\u0027\u0022"}`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				require.True(t, json.Valid([]byte(tc.payload)), "the test case is JSON")
				id, err := st.Enqueue(ctx, pool, msg("edge.case", tc.payload))
				require.NoError(t, err)
				row, err := st.Get(ctx, id)
				require.NoError(t, err)
				require.JSONEq(t, tc.payload, string(row.Payload))
			})
		}
	})

	t.Run("HeadersAndOrderingKey", func(t *testing.T) {
		t.Parallel()
		headers := map[string]string{
			"quote'key":     `value with ' and " and \`,
			`back\slash`:    "\u2028 line separator",
			"emoji 😀":       "👩‍👩‍👧 e\u0301",
			"select":        "from where",
			"rtl":           "שלום مرحبا",
			`\u0000`:        `\u0000`,
			"x-trace-state": "a=b,c=d",
		}
		key := `order-'7'-"x"-\-😀-e` + "\u0301-שלום"
		id, err := st.Enqueue(ctx, pool, store.Message{
			Topic: "edge.case", Payload: json.RawMessage(`{}`), Headers: headers, OrderingKey: key,
		})
		require.NoError(t, err)
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, headers, row.Headers)
		require.NotNil(t, row.OrderingKey)
		require.Equal(t, key, *row.OrderingKey)
	})

	t.Run("Topics", func(t *testing.T) {
		t.Parallel()
		// Topics are limited to TopicPattern, so every allowed form round-trips as is.
		for _, topic := range []string{"select", "drop.table", "order_by-1.v2", "NULL", strings.Repeat("z", 200)} {
			id, err := st.Enqueue(ctx, pool, msg(topic, `{}`))
			require.NoError(t, err, "topic %q", topic)
			row, err := st.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, topic, row.Topic)
		}
		// Anything else is refused before it reaches SQL, with the value quoted.
		for _, topic := range []string{"it's", `say "hi"`, `back\slash`, "a\u2028b", "📦", "e\u0301", "שלום", "; DROP TABLE x", `\u0000`} {
			_, err := st.Enqueue(ctx, pool, msg(topic, `{}`))
			var verr *store.ValidationError
			require.ErrorAs(t, err, &verr, "topic %q", topic)
			require.Equal(t, "topic", verr.Field)
			require.Contains(t, verr.Reason, fmt.Sprintf("got %q", topic))
		}
	})
}
