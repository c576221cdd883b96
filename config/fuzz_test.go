package config_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
)

// fieldError is how a Validate error starts: the field's path (topics["name"].url,
// relay.lease, schema/max_payload_bytes, ...) and then ": " or " must ".
var fieldError = regexp.MustCompile(`^(topics\["(?:[^"\\]|\\.)*"\]|[a-z_][a-z0-9_]*(?:/[a-z_][a-z0-9_]*)?)(?:\.[a-z_][a-z0-9_]*)*(?:: | must )`)

// FuzzParse checks the configuration path a program runs on a file it is given: Parse,
// WithDefaults, Validate. None may panic; a Parse error points at a line or says it is
// YAML's, and every error Validate reports starts with the field it is about.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		full,
		``,
		`topics: {order.created: {sink: http, url: http://inv:8080/events, check_url: "http://inv:8080/events/{message_id}", max_attempts: 4, initial_interval: 1s, backoff: 2, max_interval: 1m}}`,
		"default:\n  url: http://fallback:8080/events\n",
		"topics:\n  order.created:\n    url: ftp://x\n",
		"topics:\n  \"Order Created\":\n    url: http://x\n",
		"topics:\n  a:\n    url: http://x\n    max_attempts: -1\n    backoff: 0.5\n",
		"topics:\n  a:\n    url: http://x\n    initial_interval: 1m\n    max_interval: 1s\n",
		"topics:\n  a:\n    url: http://x\n    initial_interval: soon\n",
		"topics:\n  a:\n    url: http://x\n    check_url: http://x/check\n",
		"topics:\n  a:\n    sink: kafka\n",
		"topics:\n  \"a\\\"b\\nc\":\n    url: http://x\n",
		"relay:\n  batch_size: 0\n  poll_interval: 1ms\n  lease: -1s\n",
		"retention:\n  sent_after: 1s\n  batch_size: 1000000\n",
		"metrics:\n  address: nocolon\n",
		"alerts:\n  webhook_url: http://user:secret@host/?token=x\n",
		"schema: \"Bad Schema\"\nmax_payload_bytes: 99999999\n",
		"topix: {}\n",
		"topics: [1, 2]\n",
		"max_payload_bytes: 1e400\n",
		"a: &a [*a, *a]\n",
		"{{{",
		"\t- :",
		"---\n---\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := config.Parse(strings.NewReader(doc))
		if err != nil {
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, "yaml:") || strings.Contains(msg, "line "),
				"a parse error should point at the YAML or a line: %q", msg)
			return
		}
		require.NotNil(t, c)
		d := c.WithDefaults()
		err = d.Validate()
		for _, leaf := range leaves(err) {
			require.Regexp(t, fieldError, leaf.Error(), "a config error should start with its field")
		}
	})
}

// leaves flattens the errors.Join trees Validate returns.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}
