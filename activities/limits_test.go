package activities_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// TestSendPayloadLimit covers rows that plain SQL inserted past Enqueue's size check: the
// send refuses them as a permanent failure naming the size and the limit, without
// contacting the downstream; a payload at the limit is sent, and so is every payload
// Enqueue accepted, however jsonb prints it back.
func TestSendPayloadLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const limit = 1024
	pool, def := testdb.Schema(t)
	st, err := store.New(pool, store.Config{Schema: def.Schema(), MaxPayloadBytes: limit})
	require.NoError(t, err)
	require.Equal(t, limit, st.MaxPayloadBytes())

	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { requests.Add(1) }))
	t.Cleanup(srv.Close)
	reg, err := (&config.Config{Topics: map[string]config.Topic{
		"order.created": {Sink: "http", URL: srv.URL},
	}}).Registry(nil)
	require.NoError(t, err)
	a := &activities.Activities{Store: st, Handlers: reg}

	// insert writes a payload of exactly n bytes without whitespace with plain SQL (jsonb
	// prints it with one space more: {"s": "xx…"}).
	insert := func(t *testing.T, n int) uuid.UUID {
		var id uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload)
			VALUES ('order.created', jsonb_build_object('s', repeat('x', $1 - 8))) RETURNING message_id`, n).Scan(&id))
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Len(t, row.Payload, n+1)
		require.Equal(t, n, store.PayloadSize(row.Payload))
		return id
	}
	send := func(id uuid.UUID) error {
		return sendOnce(ctx, a, workflows.SendInput{MessageID: id.String(), Topic: "order.created", Attempt: 1, MaxAttempts: 4})
	}

	t.Run("OverLimitIsPermanent", func(t *testing.T) {
		id := insert(t, limit+1)
		before := requests.Load()
		err := send(id)
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr)
		require.Equal(t, workflows.ErrTypePermanent, appErr.Type())
		require.True(t, appErr.NonRetryable())
		require.Contains(t, appErr.Message(), fmt.Sprintf("is %d bytes without whitespace, over the payload size limit of %d bytes", limit+1, limit))
		require.Equal(t, before, requests.Load(), "the downstream is not contacted")
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Contains(t, *row.LastError, "payload size limit")
	})

	t.Run("AtLimitIsSent", func(t *testing.T) {
		id := insert(t, limit)
		before := requests.Load()
		require.NoError(t, send(id))
		require.Equal(t, before+1, requests.Load())
	})

	t.Run("EnqueuedIsSentHoweverJSONBPrintsIt", func(t *testing.T) {
		for name, payload := range map[string]string{
			// 1,023 bytes; jsonb puts a space after each comma: 1,534 bytes read back.
			"CompactArray": "[" + strings.Repeat("1,", limit/2-2) + "1]",
			// jsonb writes the number out in full: 1,024 bytes read back.
			"NumberWrittenOut": "[1e1021]",
		} {
			t.Run(name, func(t *testing.T) {
				require.LessOrEqual(t, len(payload), limit)
				id, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: json.RawMessage(payload)})
				require.NoError(t, err)
				row, err := st.Get(ctx, id)
				require.NoError(t, err)
				require.Greater(t, len(row.Payload), len(payload), "jsonb prints it longer")
				before := requests.Load()
				require.NoError(t, send(id))
				require.Equal(t, before+1, requests.Load())
			})
		}
	})

	t.Run("EnqueueCountsNumbersAsJSONBWritesThem", func(t *testing.T) {
		_, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: json.RawMessage(`[1e1022]`)})
		var verr *store.ValidationError
		require.ErrorAs(t, err, &verr)
		require.Equal(t, "payload", verr.Field)
		require.Equal(t, `must be at most 1024 bytes, got 1025 bytes as PostgreSQL's jsonb stores it, `+
			`which writes numbers out in full ("1e1022" takes 1023 bytes)`, verr.Reason)
	})

	t.Run("AlreadySentIsNotRefused", func(t *testing.T) {
		id := insert(t, limit+1)
		_, err := pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'sent' WHERE message_id = $1`, id)
		require.NoError(t, err)
		require.NoError(t, send(id), "a sent row stays a no-op")
	})
}

// TestLoadMessageEncodedSize covers a payload within the store's limit that Temporal
// would refuse to carry to a team's handler: its JSON encoding escapes each <, > and & to
// six bytes. The load refuses it as a permanent failure naming both sizes, so the run
// dead-letters it instead of failing at every try; a payload whose encoding fits loads.
func TestLoadMessageEncodedSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, def := testdb.Schema(t)
	st, err := store.New(pool, store.Config{Schema: def.Schema(), MaxPayloadBytes: store.HardMaxPayloadBytes})
	require.NoError(t, err)
	a := &activities.Activities{Store: st}

	// html is a payload of n markup characters: n+2 bytes as written, 6n+2 encoded.
	html := func(n int) json.RawMessage { return json.RawMessage(`"` + strings.Repeat("<", n) + `"`) }
	for _, p := range []json.RawMessage{html(3), json.RawMessage("{\"a\": \"x\u2028y & z\", \"b\": [1, 2]}")} {
		encoded, err := json.Marshal(p) // as the SDK's JSON converter writes it
		require.NoError(t, err)
		require.Equal(t, len(encoded), store.EncodedPayloadSize(p), "%s", encoded)
	}

	fits := (store.HardMaxPayloadBytes - 2) / 6
	for _, tc := range []struct {
		name    string
		payload json.RawMessage
		refused bool
	}{
		{"EncodedWithinTemporalsLimit", html(fits), false},
		{"EncodedOverTemporalsLimit", html(fits + 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: tc.payload})
			require.NoError(t, err, "within the store's limit")
			loaded, err := a.LoadMessage(ctx, workflows.LoadMessageInput{MessageID: id.String()})
			if !tc.refused {
				require.NoError(t, err)
				require.Equal(t, string(tc.payload), string(loaded.Message.Payload))
				return
			}
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			require.Equal(t, workflows.ErrTypePermanent, appErr.Type())
			require.True(t, appErr.NonRetryable())
			require.Contains(t, appErr.Message(), fmt.Sprintf("is %d bytes as Temporal's JSON encoding carries it to a team's handler", 6*(fits+1)+2))
			require.Contains(t, appErr.Message(), fmt.Sprintf("over the %d bytes", store.HardMaxPayloadBytes))
		})
	}

	t.Run("HeadersOverEnqueuesLimit", func(t *testing.T) {
		// Written by another program: the headers would go to the team beside the
		// payload, past the room Temporal's limit leaves for them.
		var id string
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+def.Schema()+`.outbox_messages (topic, payload, headers)
			VALUES ('order.created', '{}', jsonb_build_object('x-blob', repeat('h', $1::int))) RETURNING message_id::text`, store.MaxHeadersBytes).Scan(&id))
		_, err := a.LoadMessage(ctx, workflows.LoadMessageInput{MessageID: id})
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr)
		require.Equal(t, workflows.ErrTypePermanent, appErr.Type())
		require.True(t, appErr.NonRetryable())
		require.Contains(t, appErr.Message(), fmt.Sprintf("are %d bytes of keys and values, over the %d bytes", store.MaxHeadersBytes+len("x-blob"), store.MaxHeadersBytes))
	})
}
