package cli

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/mysqlstore"
)

// Databases are the databases besides PostgreSQL the command runs on.
var Databases = map[string]app.DatabaseOpener{config.DatabaseMySQL: openMySQL}

// openMySQL opens the MySQL or MariaDB database url names.
func openMySQL(ctx context.Context, url string, maxPayloadBytes int) (app.Database, error) {
	if _, err := mysqlstore.ParseURL(url); err != nil {
		return app.Database{}, &app.ConfigError{Err: fmt.Errorf("database_url: %w", err)}
	}
	db, err := mysqlstore.Open(ctx, url)
	if err != nil {
		return app.Database{}, &app.UnavailableError{Service: "MySQL", Err: err}
	}
	st, err := mysqlstore.New(db, mysqlstore.Config{MaxPayloadBytes: maxPayloadBytes})
	if err != nil {
		_ = db.Close()
		return app.Database{}, &app.ConfigError{Err: fmt.Errorf("mysql store: %w", err)}
	}
	return app.Database{
		Driver:  st,
		Enqueue: func(ctx context.Context, msg store.Message) (uuid.UUID, error) { return st.Enqueue(ctx, db, msg) },
		Ping:    db.PingContext,
		Close:   func() { _ = db.Close() },
	}, nil
}
