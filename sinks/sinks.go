// Package sinks holds what the broker sinks share: the templates of subjects, routing
// keys and topics, and the metadata every published message carries. The sinks themselves
// are in natssink, rabbitsink and kafkasink; config.Registry builds them from a topic's
// sink: nats, rabbitmq or kafka.
//
// A broker sink publishes the message's payload as the body (JSON, content type
// application/json) and its metadata as headers: the row's headers, Outbox-Message-Id,
// Outbox-Topic, Outbox-Created-At (RFC 3339), Outbox-Attempt, Outbox-Ordering-Key when the
// message has one, and the trace context (traceparent, tracestate) of the send span.
package sinks

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/internal/tracing"
)

// The headers every broker sink sets besides the message's own.
const (
	HeaderMessageID   = "Outbox-Message-Id"
	HeaderTopic       = "Outbox-Topic"
	HeaderCreatedAt   = "Outbox-Created-At"
	HeaderAttempt     = "Outbox-Attempt"
	HeaderOrderingKey = "Outbox-Ordering-Key"
)

// Placeholders are the names a template may use, in braces.
var Placeholders = []string{"topic", "message_id", "ordering_key"}

var placeholder = regexp.MustCompile(`\{[^{}]*\}`)

// Template is a subject, routing key or topic name with placeholders: {topic},
// {message_id} and {ordering_key}.
type Template struct {
	text        string
	usesOrdKey  bool
	placeholder bool
}

// ParseTemplate checks text's placeholders; the error names each unknown one and what
// is allowed.
func ParseTemplate(text string) (Template, error) {
	t := Template{text: text}
	for _, p := range placeholder.FindAllString(text, -1) {
		name := strings.Trim(p, "{}")
		switch name {
		case "ordering_key":
			t.usesOrdKey = true
		case "topic", "message_id":
		default:
			return Template{}, fmt.Errorf("unknown placeholder %s in %q; allowed: {topic}, {message_id}, {ordering_key}", p, text)
		}
		t.placeholder = true
	}
	if strings.ContainsAny(placeholder.ReplaceAllString(text, ""), "{}") {
		return Template{}, fmt.Errorf("unbalanced brace in %q; placeholders are {topic}, {message_id}, {ordering_key}", text)
	}
	return t, nil
}

// MustParseTemplate is ParseTemplate that panics on an error, for constants.
func MustParseTemplate(text string) Template {
	t, err := ParseTemplate(text)
	if err != nil {
		panic(err)
	}
	return t
}

// String returns the template's text.
func (t Template) String() string { return t.text }

// Static reports whether the template has no placeholder, so every message gets the same
// value.
func (t Template) Static() bool { return !t.placeholder }

// Expand fills the placeholders from d. A template that uses {ordering_key} cannot expand
// for a message without one: the error is permanent.
func (t Template) Expand(d activities.Delivery) (string, error) {
	if t.usesOrdKey && d.OrderingKey == "" {
		return "", activities.Permanent(fmt.Errorf("%q uses {ordering_key}, but message %s has no ordering key", t.text, d.MessageID))
	}
	if !t.placeholder {
		return t.text, nil
	}
	return strings.NewReplacer("{topic}", d.Topic, "{message_id}", d.MessageID.String(), "{ordering_key}", d.OrderingKey).Replace(t.text), nil
}

// Headers returns the headers a broker sink publishes with d: the message's own, then the
// outbox's (which win over a message header of the same name) and the trace context of
// ctx's span.
func Headers(ctx context.Context, d activities.Delivery, extra map[string]string) map[string]string {
	h := make(map[string]string, len(d.Headers)+len(extra)+7)
	for k, v := range extra {
		h[k] = v
	}
	for k, v := range d.Headers {
		h[k] = v
	}
	h[HeaderMessageID] = d.MessageID.String()
	h[HeaderTopic] = d.Topic
	h[HeaderCreatedAt] = d.CreatedAt.UTC().Format(time.RFC3339Nano)
	h[HeaderAttempt] = strconv.Itoa(d.Attempt)
	if d.OrderingKey != "" {
		h[HeaderOrderingKey] = d.OrderingKey
	}
	tracing.Propagator(nil).Inject(ctx, propagation.MapCarrier(h))
	return h
}

// Redact returns the form of a broker URL that errors and logs may show: scheme, host and
// port, without credentials, path or query.
func Redact(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return "(unparsable URL)"
	}
	rest := raw[i+3:]
	// User information first, up to the last @: a password may hold /, ? or # that
	// were not percent-encoded.
	if j := strings.LastIndex(rest, "@"); j >= 0 {
		rest = rest[j+1:]
	}
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		rest = rest[:j]
	}
	return raw[:i+3] + rest
}
