package redact

import (
	"strings"
	"testing"
)

func TestURLShowsOnlySchemeAndHost(t *testing.T) {
	for raw, want := range map[string]string{
		"https://hooks.slack.com/services/T000/B000/XXXXSECRET":     "https://hooks.slack.com",
		"https://user:s3cr%zzet@host/x":                             "https://host",
		"https://user:pa/ss?#word@host:8443/path?token=SECRET#frag": "https://host:8443",
		"HTTP://Example.com/webhook/SECRET":                         "http://Example.com",
		"amqp://guest:guest@127.0.0.1:5672/vhost":                   "amqp://127.0.0.1:5672",
		"nats://tok3n@nats.internal:4222":                           "nats://nats.internal:4222",
		"amqp://outbox:1234#SECRET@rabbit:5672/v":                   Unparsable, // user:1234 or host:port? neither is shown
		"https://api.x.com/notify?from=ops@corp.com&api_key=SECRET": "https://api.x.com",
		"https://h/u/alice@SECRET":                                  "https://h",
		"https://h:8443/u/alice@SECRET":                             Unparsable,
		"https://user:p@ss@host/SECRET":                             "https://host",
		"https://user:p@ss@[::1]:8443/SECRET":                       "https://[::1]:8443",
		"https://h/x?api_key=SECRET":                                "https://h",
		"no scheme SECRET":                                          Unparsable,
		"://SECRET":                                                 Unparsable,
		"https://":                                                  Unparsable,
	} {
		got := URL(raw)
		if got != want {
			t.Errorf("URL(%q) = %q, want %q", raw, got, want)
		}
		for _, secret := range []string{"SECRET", "s3cr", "pa/ss", "guest", "tok3n", "token"} {
			if strings.Contains(got, secret) {
				t.Errorf("URL(%q) = %q shows %q", raw, got, secret)
			}
		}
	}
}

func TestAddress(t *testing.T) {
	for in, want := range map[string]string{
		"kafka-1:9092":                    "kafka-1:9092",
		"user:hunter2@kafka-1:9092":       "(user information hidden)@kafka-1:9092",
		"kafka://user:hunter2@kafka:9092": "kafka://kafka:9092",
		// A malformed libpq connection string: quoted, or with a typo.
		`"host=db user=app password=s3cret"`:        `"host=db user=app password=(hidden)"`,
		`'host=db password='s3 cret''`:              `'host=db password=(hidden)'`,
		"host:db password=s3cret":                   "host:db password=(hidden)",
		"host=db PASSWORD = s3cret sslmode=require": "host=db PASSWORD=(hidden) sslmode=require",
		"api_token=abc123 kafka-1:9092":             "api_token=(hidden) kafka-1:9092",
		"tokenizer:9092":                            "tokenizer:9092",
		// An @ in the user or the password, an escaped quote.
		`"host=db user=app@myserver password=hunter2"`:    `(user information hidden)@myserver password=(hidden)"`,
		`"host=db password=hunt@er2"`:                     `"host=db password=(hidden)"`,
		`host=db password='it\'s secret' sslmode=require`: `host=db password=(hidden) sslmode=require`,
	} {
		if got := Address(in); got != want {
			t.Errorf("Address(%q) = %q, want %q", in, got, want)
		}
	}
}
