package storedriver

import (
	"context"

	"github.com/google/uuid"
)

// Database is an open outbox database as a program that runs the outbox from its config
// uses it (package app, and the outbox command): the store, and what the program needs
// around it.
type Database struct {
	Driver Driver
	// Enqueue enqueues one message in a transaction of its own (outbox enqueue).
	Enqueue func(ctx context.Context, msg Message) (uuid.UUID, error)
	// Ping checks that the database answers, for readiness.
	Ping func(ctx context.Context) error
	// Close closes its connections.
	Close func()
}

// Opener connects to the database url names, checks that it answers, and returns it with
// its outbox store, whose payloads may be at most maxPayloadBytes (0: the default). An
// error that retrying cannot mend (url or a setting is wrong) is a *ConfigError; any other
// error means the database did not answer. mysqlstore.OpenDatabase is MySQL's.
type Opener func(ctx context.Context, url string, maxPayloadBytes int) (Database, error)

// ConfigError is an Opener's error for a url or setting that is wrong.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }
