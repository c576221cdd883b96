package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/webhook"
)

// TestSignedWebhooks: a topic with two signing secrets (read from files, as during a
// rotation) sends requests that a receiver verifies with either secret, with the message
// ID as webhook-id on every attempt; a receiver with another secret, or one whose clock is
// past the tolerance, refuses them.
func TestSignedWebhooks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldSecret, newSecret := webhook.NewSecret(), webhook.NewSecret()
	for name, secret := range map[string]string{"old": oldSecret, "new": newSecret} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(secret+"\n"), 0o600))
	}
	verifyOld, err := webhook.NewVerifier(oldSecret)
	require.NoError(t, err)
	verifyNew, err := webhook.NewVerifier(newSecret)
	require.NoError(t, err)

	type request struct {
		header http.Header
		body   []byte
	}
	var (
		mu       sync.Mutex
		requests []request
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, request{r.Header.Clone(), body})
		if err := verifyNew.Verify(r.Header, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if len(requests) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // the first attempt is refused: a retry follows
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)

	e := newEnv(t, newServer(t))
	e.cfg.Topics["order.signed"] = config.Topic{URL: srv.URL + "/events",
		SigningSecrets:  []string{"file:" + filepath.Join(dir, "new"), "file:" + filepath.Join(dir, "old")},
		InitialInterval: config.Duration(50 * time.Millisecond)}
	e.startWorker(t)
	e.startRelay(t)
	id := e.enqueueOrderPlain(t, "order.signed", nil)
	e.waitStatus(t, id, store.StatusSent)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, requests, 2)
	for _, r := range requests {
		require.Equal(t, id.String(), r.header.Get(webhook.HeaderID), "webhook-id is the message ID on every attempt")
		require.NoError(t, verifyNew.Verify(r.header, r.body))
		require.NoError(t, verifyOld.Verify(r.header, r.body), "the old secret verifies too, during the rotation")
	}
	last := requests[1]
	other, err := webhook.NewVerifier(webhook.NewSecret())
	require.NoError(t, err)
	require.ErrorIs(t, other.Verify(last.header, last.body), webhook.ErrSignature)
	late := &webhook.Verifier{Keys: verifyNew.Keys, Now: func() time.Time { return time.Now().Add(10 * time.Minute) }}
	require.ErrorIs(t, late.Verify(last.header, last.body), webhook.ErrTimestamp)
}
