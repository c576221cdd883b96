package app_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestOpenChoosesTheDatabase: database_url's form picks the store. PostgreSQL is the
// library's own; another database opens through Options.Databases, and without an opener
// for it Open says so as a config error, connecting to nothing.
func TestOpenChoosesTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	topics := map[string]config.Topic{"order.created": {URL: "http://127.0.0.1:1/events"}}

	t.Run("PostgreSQL", func(t *testing.T) {
		_, st := testdb.Schema(t)
		a, err := app.Open(ctx, &config.Config{DatabaseURL: testdb.URL(), Schema: st.Schema(), Topics: topics}, app.Options{Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(a.Close)
		require.Equal(t, "postgres", a.Driver.Kind())
		require.NotNil(t, a.Pool)
		require.NotNil(t, a.Store)
		id, err := a.Enqueue(ctx, store.Message{Topic: "order.created", Payload: []byte(`{"order_id": 1}`)})
		require.NoError(t, err)
		row, err := a.Driver.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusPending, row.Status)
		// Open connects to the database only: what needs Temporal says so.
		require.ErrorContains(t, a.EnsureRetentionSchedule(ctx), "not connected to Temporal")
	})

	t.Run("WithoutOpener", func(t *testing.T) {
		_, err := app.Open(ctx, &config.Config{DatabaseURL: "mysql://app:hunter2@127.0.0.1:1/app", Topics: topics}, app.Options{Logger: quiet})
		var cfgErr *app.ConfigError
		require.True(t, errors.As(err, &cfgErr), "want a config error, got %v", err)
		require.ErrorContains(t, err, "database_url names a mysql database, which this program was built without")
		require.NotContains(t, err.Error(), "hunter2")
	})

	t.Run("ThroughTheOpener", func(t *testing.T) {
		_, st := testdb.Schema(t)
		var gotURL string
		var gotMax int
		opened := false
		a, err := app.Open(ctx, &config.Config{DatabaseURL: "mysql://app@db:3306/app", Topics: topics}, app.Options{Logger: quiet,
			Databases: map[string]app.DatabaseOpener{config.DatabaseMySQL: func(_ context.Context, url string, maxPayloadBytes int) (app.Database, error) {
				gotURL, gotMax, opened = url, maxPayloadBytes, true
				// A stand-in store for the opener's: the App uses whatever Driver it returns.
				return app.Database{
					Driver:  st,
					Enqueue: func(context.Context, store.Message) (uuid.UUID, error) { return uuid.Nil, errors.New("not here") },
					Ping:    func(context.Context) error { return nil },
					Close:   func() { opened = false },
				}, nil
			}}})
		require.NoError(t, err)
		require.Equal(t, "mysql://app@db:3306/app", gotURL)
		require.Equal(t, store.DefaultMaxPayloadBytes, gotMax)
		require.Same(t, st, a.Driver)
		require.Nil(t, a.Pool)
		require.Nil(t, a.Store)
		a.Close()
		require.False(t, opened, "Close closes the opener's database")
	})
}
