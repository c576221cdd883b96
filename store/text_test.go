package store_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

func TestStorableText(t *testing.T) {
	t.Parallel()

	t.Run("Cases", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "plain", store.StorableText("plain"))
		require.Equal(t, `HTTP 500: a\x00b`, store.StorableText("HTTP 500: a\x00b"))
		require.Equal(t, "bad \uFFFD byte", store.StorableText("bad \xff byte"))
		long := store.StorableText(strings.Repeat("é", store.MaxErrorTextBytes))
		require.LessOrEqual(t, len(long), store.MaxErrorTextBytes)
		require.True(t, utf8.ValidString(long))
		require.True(t, strings.HasSuffix(long, "…"))
	})

	// What PostgreSQL refuses reaches every error column through the store unharmed.
	t.Run("WritesWhatPostgreSQLRefuses", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool, st := testdb.Schema(t)
		id, err := st.Enqueue(ctx, pool, msg("order.created", `{}`))
		require.NoError(t, err)
		bad := "HTTP 422: \x00\x01\xfe binary body"

		ok, err := st.RecordFailure(ctx, id, 1, bad)
		require.NoError(t, err)
		require.True(t, ok)
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "HTTP 422: \\x00\x01\uFFFD binary body", *row.LastError)

		ok, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, WorkflowID: "outbox-" + id.String(), RunID: uuid.NewString(), Attempts: 1, LastError: "permanent failure: " + bad})
		require.NoError(t, err)
		require.True(t, ok)
		dead, err := st.DeadLetters(ctx, id)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Contains(t, dead[0].LastError, `\x00`)

		_, err = st.Redrive(ctx, id, "ops\x00bot")
		require.NoError(t, err)
		audit, err := st.Audit(ctx, id)
		require.NoError(t, err)
		require.Equal(t, `ops\x00bot`, audit[0].Actor)
	})
}
