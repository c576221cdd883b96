package testutil

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// Stream connects to the NATS server at url and makes a stream of the test's own over
// <prefix><random>.>, with the duplicate window window (zero: the server's default),
// removed when the test ends. It returns the JetStream context, the stream and its
// subject prefix.
func Stream(t testing.TB, url, prefix string, window time.Duration) (jetstream.JetStream, jetstream.Stream, string) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err, "NATS with JetStream must run at %s: run scripts/services.sh", url)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	prefix += uuid.NewString()[:8]
	st, err := CreateStream(context.Background(), js, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, Duplicates: window})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), prefix) })
	return js, st, prefix
}

// anchorStream is a stream the tests create and never delete. nats-server 2.9 (Debian's
// package) removes the account's stream directory with its last stream, and a stream
// created at that moment fails with "error creating store for stream" (10049); while one
// stream stays, the directory does too.
const anchorStream = "outbox_test_anchor"

// CreateStream creates a JetStream stream for a test, first making sure the anchor stream
// exists. The caller deletes the stream it made.
func CreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	anchor := jetstream.StreamConfig{Name: anchorStream, Subjects: []string{anchorStream + ".>"}, Storage: jetstream.FileStorage}
	var err error
	for range 5 {
		if _, err = js.CreateOrUpdateStream(ctx, anchor); err == nil {
			var st jetstream.Stream
			if st, err = js.CreateStream(ctx, cfg); err == nil {
				return st, nil
			}
		}
		if !isStoreRace(err) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

// isStoreRace reports the server's failure to make a stream's store directory.
func isStoreRace(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10049
}
