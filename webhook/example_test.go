package webhook_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/outbox-go/outbox/webhook"
)

// A receiver of the http sink's signed POSTs checks the signature on the raw body before it
// parses it, and answers 401 to a request that fails: the outbox then dead-letters the
// message as a permanent failure instead of retrying it.
func Example() {
	secret := webhook.NewSecret() // in production: the topic's signing_secrets entry, from the environment
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		log.Fatal(err)
	}
	events := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := v.Verify(r.Header, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		// Handle the event, de-duplicated by r.Header.Get(webhook.HeaderID): the message ID.
		w.WriteHeader(http.StatusNoContent)
	})

	// A POST signed as the http sink signs it, and the same headers on a changed body.
	key, _ := webhook.ParseSecret(secret)
	signed := []byte(`{"message_id":"0195c2a0-0000-7000-8000-0000000000aa","topic":"order.created","payload":{"order_id":42}}`)
	for _, body := range [][]byte{signed, bytes.Replace(signed, []byte("42"), []byte("43"), 1)} {
		req := httptest.NewRequest(http.MethodPost, "/events", bytes.NewReader(body))
		webhook.SetHeaders(req.Header, "0195c2a0-0000-7000-8000-0000000000aa", time.Now(), signed, key)
		rec := httptest.NewRecorder()
		events.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
	}
	// Output:
	// 204
	// 401
}

// Verify accepts a request whose timestamp is within the tolerance of the receiver's clock
// and which carries a signature by one of the verifier's secrets (both the old and the new
// secret verify during a rotation).
func ExampleVerifier_Verify() {
	oldSecret, newSecret := webhook.NewSecret(), webhook.NewSecret()
	v, err := webhook.NewVerifier(oldSecret, newSecret)
	if err != nil {
		log.Fatal(err)
	}

	// The headers the http sink sets on a POST signed with the new secret.
	key, _ := webhook.ParseSecret(newSecret)
	body := []byte(`{"order_id":42}`)
	h := http.Header{}
	webhook.SetHeaders(h, "0195c2a0-0000-7000-8000-0000000000aa", time.Now(), body, key)
	fmt.Println("signed:", v.Verify(h, body))

	err = v.Verify(h, []byte(`{"order_id":43}`))
	fmt.Println("tampered:", errors.Is(err, webhook.ErrSignature))

	stale := http.Header{}
	webhook.SetHeaders(stale, "0195c2a0-0000-7000-8000-0000000000aa", time.Now().Add(-time.Hour), body, key)
	fmt.Println("replayed an hour later:", errors.Is(v.Verify(stale, body), webhook.ErrTimestamp))

	fmt.Println("unsigned:", errors.Is(v.Verify(http.Header{}, body), webhook.ErrMissingHeaders))
	// Output:
	// signed: <nil>
	// tampered: true
	// replayed an hour later: true
	// unsigned: true
}
