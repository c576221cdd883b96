package webhook_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-go/outbox/webhook"
)

// The reference vector of the Standard Webhooks specification.
const (
	refSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	refID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	refTimestamp = 1614265330
	refBody      = `{"test": 2432232314}`
	refSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func mustParse(t *testing.T, secret string) []byte {
	t.Helper()
	key, err := webhook.ParseSecret(secret)
	if err != nil {
		t.Fatalf("ParseSecret: %v", err)
	}
	return key
}

// at returns a verifier of secrets whose clock reads now.
func at(t *testing.T, now time.Time, secrets ...string) *webhook.Verifier {
	t.Helper()
	v, err := webhook.NewVerifier(secrets...)
	if err != nil {
		t.Fatalf("NewVerifier: %v", err)
	}
	v.Now = func() time.Time { return now }
	return v
}

func TestReferenceVector(t *testing.T) {
	t.Parallel()
	key := mustParse(t, refSecret)
	ts := time.Unix(refTimestamp, 0)

	if got := webhook.Sign(refID, ts, []byte(refBody), key); got != refSignature {
		t.Fatalf("Sign = %q, want %q", got, refSignature)
	}

	h := http.Header{}
	webhook.SetHeaders(h, refID, ts, []byte(refBody), key)
	for name, want := range map[string]string{
		webhook.HeaderID: refID, webhook.HeaderTimestamp: "1614265330", webhook.HeaderSignature: refSignature,
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}

	// The headers as the specification shows them verify at the time they were made.
	ref := http.Header{}
	ref.Set(webhook.HeaderID, refID)
	ref.Set(webhook.HeaderTimestamp, strconv.Itoa(refTimestamp))
	ref.Set(webhook.HeaderSignature, refSignature)
	if err := at(t, ts, refSecret).Verify(ref, []byte(refBody)); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	secret, other := webhook.NewSecret(), webhook.NewSecret()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	body := []byte(`{"message_id":"0195c2a0-0000-7000-8000-0000000000aa","payload":{"order_id":7}}`)
	signed := func(ts time.Time, body []byte, secrets ...string) http.Header {
		keys := make([][]byte, len(secrets))
		for i, s := range secrets {
			keys[i] = mustParse(t, s)
		}
		h := http.Header{}
		webhook.SetHeaders(h, "0195c2a0-0000-7000-8000-0000000000aa", ts, body, keys...)
		return h
	}

	t.Run("RightSecret", func(t *testing.T) {
		t.Parallel()
		if err := at(t, now, secret).Verify(signed(now, body, secret), body); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	})

	t.Run("WrongSecret", func(t *testing.T) {
		t.Parallel()
		err := at(t, now, other).Verify(signed(now, body, secret), body)
		if !errors.Is(err, webhook.ErrSignature) {
			t.Fatalf("Verify = %v, want ErrSignature", err)
		}
	})

	t.Run("Tolerance", func(t *testing.T) {
		t.Parallel()
		v := at(t, now, secret)
		for _, tc := range []struct {
			name string
			skew time.Duration // of the timestamp from the verifier's clock
			want error
		}{
			{"Stale", -webhook.DefaultTolerance - time.Second, webhook.ErrTimestamp},
			{"Future", webhook.DefaultTolerance + time.Second, webhook.ErrTimestamp},
			{"OldestAccepted", -webhook.DefaultTolerance, nil},
			{"LatestAccepted", webhook.DefaultTolerance, nil},
		} {
			ts := now.Add(tc.skew)
			if err := v.Verify(signed(ts, body, secret), body); !errors.Is(err, tc.want) {
				t.Errorf("%s: Verify = %v, want %v", tc.name, err, tc.want)
			}
		}

		// A tolerance of its own replaces the default.
		v.Tolerance = time.Minute
		if err := v.Verify(signed(now.Add(-2*time.Minute), body, secret), body); !errors.Is(err, webhook.ErrTimestamp) {
			t.Errorf("custom tolerance: Verify = %v, want ErrTimestamp", err)
		}
	})

	t.Run("TimestampNotUnixSeconds", func(t *testing.T) {
		t.Parallel()
		h := signed(now, body, secret)
		h.Set(webhook.HeaderTimestamp, now.Format(time.RFC3339))
		if err := at(t, now, secret).Verify(h, body); !errors.Is(err, webhook.ErrTimestamp) {
			t.Fatalf("Verify = %v, want ErrTimestamp", err)
		}
	})

	t.Run("MissingHeaders", func(t *testing.T) {
		t.Parallel()
		v := at(t, now, secret)
		for _, name := range []string{webhook.HeaderID, webhook.HeaderTimestamp, webhook.HeaderSignature} {
			h := signed(now, body, secret)
			h.Del(name)
			if err := v.Verify(h, body); !errors.Is(err, webhook.ErrMissingHeaders) {
				t.Errorf("without %s: Verify = %v, want ErrMissingHeaders", name, err)
			}
		}
		if err := v.Verify(http.Header{}, body); !errors.Is(err, webhook.ErrMissingHeaders) {
			t.Errorf("no headers: Verify = %v, want ErrMissingHeaders", err)
		}
	})

	t.Run("Rotation", func(t *testing.T) {
		t.Parallel()
		h := signed(now, body, secret, other)
		if sigs := strings.Fields(h.Get(webhook.HeaderSignature)); len(sigs) != 2 {
			t.Fatalf("webhook-signature holds %d signatures, want 2: %q", len(sigs), sigs)
		}
		for name, v := range map[string]*webhook.Verifier{
			"old": at(t, now, secret), "new": at(t, now, other), "both": at(t, now, other, secret),
		} {
			if err := v.Verify(h, body); err != nil {
				t.Errorf("%s secret: Verify: %v", name, err)
			}
		}
		if err := at(t, now, webhook.NewSecret()).Verify(h, body); !errors.Is(err, webhook.ErrSignature) {
			t.Errorf("a third secret: Verify = %v, want ErrSignature", err)
		}
	})

	t.Run("BodyChanged", func(t *testing.T) {
		t.Parallel()
		h := signed(now, body, secret)
		changed := bytes.Clone(body)
		changed[len(changed)-2]++ // 7 becomes 8
		if err := at(t, now, secret).Verify(h, changed); !errors.Is(err, webhook.ErrSignature) {
			t.Fatalf("Verify = %v, want ErrSignature", err)
		}
	})

	t.Run("IDOrTimestampChanged", func(t *testing.T) {
		t.Parallel()
		v := at(t, now, secret)
		h := signed(now, body, secret)
		h.Set(webhook.HeaderID, "0195c2a0-0000-7000-8000-0000000000bb")
		if err := v.Verify(h, body); !errors.Is(err, webhook.ErrSignature) {
			t.Errorf("other id: Verify = %v, want ErrSignature", err)
		}
		h = signed(now, body, secret)
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10))
		if err := v.Verify(h, body); !errors.Is(err, webhook.ErrSignature) {
			t.Errorf("other timestamp: Verify = %v, want ErrSignature", err)
		}
	})

	t.Run("OtherVersionsIgnored", func(t *testing.T) {
		t.Parallel()
		h := signed(now, body, secret)
		sig := h.Get(webhook.HeaderSignature)
		v := at(t, now, secret)
		h.Set(webhook.HeaderSignature, "v1a,"+strings.TrimPrefix(sig, "v1,")+" garbage "+sig)
		if err := v.Verify(h, body); err != nil {
			t.Errorf("a v1 signature among others: Verify: %v", err)
		}
		h.Set(webhook.HeaderSignature, "v2,"+strings.TrimPrefix(sig, "v1,"))
		if err := v.Verify(h, body); !errors.Is(err, webhook.ErrSignature) {
			t.Errorf("no v1 signature: Verify = %v, want ErrSignature", err)
		}
	})
}

func TestParseSecret(t *testing.T) {
	t.Parallel()
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa5}, n)) }

	for _, s := range []string{refSecret, strings.TrimPrefix(refSecret, webhook.SecretPrefix), " " + refSecret + "\n"} {
		key, err := webhook.ParseSecret(s)
		if err != nil {
			t.Errorf("ParseSecret(%q): %v", s, err)
		} else if len(key) != 24 {
			t.Errorf("ParseSecret(%q) holds %d bytes, want 24", s, len(key))
		}
	}
	for _, n := range []int{webhook.MinSecretBytes, webhook.MaxSecretBytes} {
		if _, err := webhook.ParseSecret(webhook.SecretPrefix + b64(n)); err != nil {
			t.Errorf("%d bytes: %v", n, err)
		}
	}

	for _, tc := range []struct {
		name, secret, reason string
	}{
		{"NotBase64", webhook.SecretPrefix + "hunter2-hunter2-hunter2-hunter2!", "not base64"},
		{"URLAlphabet", webhook.SecretPrefix + "hunter2_hunter2_hunter2_hunter2_", "not base64"},
		{"TooShort", webhook.SecretPrefix + b64(webhook.MinSecretBytes-1), "holds 23"},
		{"TooLong", webhook.SecretPrefix + b64(webhook.MaxSecretBytes+1), "holds 65"},
		{"Empty", "", "holds 0"},
	} {
		_, err := webhook.ParseSecret(tc.secret)
		if err == nil {
			t.Errorf("%s: ParseSecret accepted it", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: error %q does not say %q", tc.name, err, tc.reason)
		}
		if body := strings.TrimPrefix(tc.secret, webhook.SecretPrefix); body != "" && strings.Contains(err.Error(), body) {
			t.Errorf("%s: error %q quotes the secret", tc.name, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error %q quotes part of the secret", tc.name, err)
		}
	}
}

func TestNewSecret(t *testing.T) {
	t.Parallel()
	secret := webhook.NewSecret()
	if !strings.HasPrefix(secret, webhook.SecretPrefix) {
		t.Fatalf("NewSecret = %q, want the %s prefix", secret, webhook.SecretPrefix)
	}
	key := mustParse(t, secret)
	if len(key) != 32 {
		t.Fatalf("the secret holds %d bytes, want 32", len(key))
	}
	if got := webhook.SecretPrefix + base64.StdEncoding.EncodeToString(key); got != secret {
		t.Fatalf("the key encodes to %q, want %q", got, secret)
	}
	if webhook.NewSecret() == secret {
		t.Fatal("two secrets are the same")
	}

	// What the key signs, the text form verifies.
	now := time.Now()
	h := http.Header{}
	webhook.SetHeaders(h, "msg_1", now, []byte("{}"), key)
	if err := at(t, now, secret).Verify(h, []byte("{}")); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestNewVerifier(t *testing.T) {
	t.Parallel()
	if _, err := webhook.NewVerifier(); err == nil {
		t.Error("NewVerifier() accepted no secrets")
	}
	_, err := webhook.NewVerifier(webhook.NewSecret(), "whsec_not-base64-hunter2")
	if err == nil {
		t.Fatal("NewVerifier accepted a bad secret")
	}
	if !strings.Contains(err.Error(), "secret 2") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %q should name secret 2 and not quote it", err)
	}
}
