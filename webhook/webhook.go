// Package webhook signs and verifies webhook requests by the Standard Webhooks convention
// (https://www.standardwebhooks.com): the headers webhook-id, webhook-timestamp (Unix
// seconds) and webhook-signature, a space-separated list of "v1," + base64 of
// HMAC-SHA256(secret, id + "." + timestamp + "." + body), one per signing secret.
//
// The outbox's http sink signs every request of a topic with signing_secrets; webhook-id
// is the message ID, the same on every attempt. A receiver verifies with a Verifier:
//
//	v, err := webhook.NewVerifier(os.Getenv("ORDERS_WEBHOOK_SECRET"))
//	...
//	body, _ := io.ReadAll(r.Body)
//	if err := v.Verify(r.Header, body); err != nil {
//		http.Error(w, err.Error(), http.StatusUnauthorized)
//		return
//	}
//
// The package uses the standard library only.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a signed request.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts a secret's text form.
const SecretPrefix = "whsec_"

// Secret lengths the convention allows, in bytes.
const (
	MinSecretBytes = 24
	MaxSecretBytes = 64
)

// DefaultTolerance is how far a request's timestamp may be from the receiver's clock.
const DefaultTolerance = 5 * time.Minute

// Verification failures.
var (
	ErrMissingHeaders = errors.New("webhook: the request lacks webhook-id, webhook-timestamp or webhook-signature")
	ErrTimestamp      = errors.New("webhook: the timestamp is outside the tolerance (stale or from the future), or not Unix seconds")
	ErrSignature      = errors.New("webhook: no signature matches a secret")
)

// ParseSecret returns the key of a secret in its text form: "whsec_" followed by the
// base64 of 24 to 64 bytes (the prefix may be left out). The error never quotes the
// secret.
func ParseSecret(s string) ([]byte, error) {
	s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), SecretPrefix))
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("a signing secret must be %s followed by standard base64, and this one is not base64", SecretPrefix)
	}
	if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
		return nil, fmt.Errorf("a signing secret must hold %d to %d bytes, this one holds %d", MinSecretBytes, MaxSecretBytes, len(key))
	}
	return key, nil
}

// NewSecret returns a new random secret of 32 bytes in its text form.
func NewSecret() string {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return SecretPrefix + base64.StdEncoding.EncodeToString(key)
}

// Sign returns the webhook-signature value of a request: one v1 signature per key.
func Sign(id string, timestamp time.Time, body []byte, keys ...[]byte) string {
	sigs := make([]string, len(keys))
	for i, key := range keys {
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(mac(key, id, timestamp.Unix(), body))
	}
	return strings.Join(sigs, " ")
}

// SetHeaders sets the three headers of a signed request on h.
func SetHeaders(h http.Header, id string, timestamp time.Time, body []byte, keys ...[]byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(timestamp.Unix(), 10))
	h.Set(HeaderSignature, Sign(id, timestamp, body, keys...))
}

func mac(key []byte, id string, ts int64, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verifier checks signed requests against one or more secrets (during a rotation, the
// old and the new).
type Verifier struct {
	Keys [][]byte
	// Tolerance is how far the timestamp may be from Now. Defaults to DefaultTolerance.
	Tolerance time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
}

// NewVerifier returns a Verifier of secrets in their text form.
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("webhook: a verifier needs at least one secret")
	}
	v := &Verifier{}
	for i, s := range secrets {
		key, err := ParseSecret(s)
		if err != nil {
			return nil, fmt.Errorf("webhook: secret %d: %w", i+1, err)
		}
		v.Keys = append(v.Keys, key)
	}
	return v, nil
}

// Verify checks the headers of a request against its body: the timestamp within the
// tolerance and a v1 signature made with one of the keys.
func (v *Verifier) Verify(h http.Header, body []byte) error {
	id, tsText, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsText == "" || sigs == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return ErrTimestamp
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	tolerance := v.Tolerance
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if d := now().Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return ErrTimestamp
	}
	for _, key := range v.Keys {
		want := mac(key, id, ts, body)
		for _, sig := range strings.Fields(sigs) {
			version, b64, ok := strings.Cut(sig, ",")
			if !ok || version != "v1" {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return ErrSignature
}
