// Package sinks holds what the broker sinks share: the templates of subjects, routing
// keys and topics, and the metadata every published message carries. The sinks themselves
// are in natssink, rabbitsink and kafkasink; config.Registry builds them from a topic's
// sink: nats, rabbitmq or kafka.
//
// A broker sink publishes the message's payload as the body (JSON, content type
// application/json) and its metadata as headers: the row's headers (none that the broker
// acts on: see [Reserved]), Outbox-Message-Id,
// Outbox-Topic, Outbox-Created-At (RFC 3339), Outbox-Attempt, Outbox-Ordering-Key when the
// message has one, and the trace context (traceparent, tracestate) of the send span.
package sinks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/internal/redact"
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

// Reserved names the headers a broker acts on, besides carrying them: NATS's Nats-*
// (Nats-Rollup purges a subject, Nats-Expected-* fail every publish, Nats-Msg-Id is the
// outbox's de-duplication key), RabbitMQ's CC and BCC (more routing keys) and x-* (read by
// plugins and queues). Every sink also reserves the outbox's own Outbox-* headers. A
// message's headers come from whoever writes the row, so none of them may steer the
// broker; a topic's configured headers may not either. Outbox-* and NATS's names compare
// case-insensitively; RabbitMQ's exactly, as the broker compares them (so X-Request-Id
// passes and x-delay does not).
type Reserved struct {
	Sink      string   // the sink kind, for errors
	Names     []string // reserved names
	Prefixes  []string // reserved prefixes
	ExactCase bool     // Names and Prefixes compare case-sensitively
}

// The headers each broker sink reserves.
var (
	NATSReserved     = Reserved{Sink: "nats", Prefixes: []string{"Nats-"}}
	RabbitMQReserved = Reserved{Sink: "rabbitmq", Names: []string{"CC", "BCC"}, Prefixes: []string{"x-"}, ExactCase: true}
	KafkaReserved    = Reserved{Sink: "kafka"}
)

// outboxPrefix starts the headers the outbox sets on every message.
const outboxPrefix = "Outbox-"

// Check returns an error naming header name and the sink when the sink reserves it.
func (r Reserved) Check(name string) error {
	equal := strings.EqualFold
	if r.ExactCase {
		equal = func(a, b string) bool { return a == b }
	}
	hasPrefix := func(p string) bool { return len(name) >= len(p) && equal(name[:len(p)], p) }
	if len(name) >= len(outboxPrefix) && strings.EqualFold(name[:len(outboxPrefix)], outboxPrefix) {
		return fmt.Errorf("header %q: Outbox-* headers are set by the outbox on every message and cannot be set otherwise", name)
	}
	for _, n := range r.Names {
		if equal(name, n) {
			return fmt.Errorf("header %q: the %s sink reserves it (the broker acts on it); reserved: %s", name, r.Sink, r.list())
		}
	}
	for _, p := range r.Prefixes {
		if hasPrefix(p) {
			return fmt.Errorf("header %q: the %s sink reserves %s* headers (the broker acts on them); reserved: %s", name, r.Sink, p, r.list())
		}
	}
	return nil
}

// CheckConfig checks a topic's configured headers, for a sink's constructor.
func (r Reserved) CheckConfig(headers map[string]string) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(headers)) {
		if err := r.Check(name); err != nil {
			errs = append(errs, fmt.Errorf("headers: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (r Reserved) list() string {
	all := []string{outboxPrefix + "*"}
	for _, p := range r.Prefixes {
		all = append(all, p+"*")
	}
	return strings.Join(append(all, r.Names...), ", ")
}

// Headers returns the headers a broker sink publishes with d: the topic's configured
// extra, the message's own, then the outbox's and the trace context of ctx's span (which
// replace a message's traceparent and tracestate). A message header that r reserves fails
// the send permanently (the message is dead-lettered with the header's name): a row cannot
// steer the broker.
func Headers(ctx context.Context, d activities.Delivery, extra map[string]string, r Reserved) (map[string]string, error) {
	h := make(map[string]string, len(d.Headers)+len(extra)+7)
	for k, v := range extra {
		h[k] = v
	}
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		if err := r.Check(k); err != nil {
			return nil, activities.Permanent(fmt.Errorf("message %s: %w; rename it in the row's headers", d.MessageID, err))
		}
		h[k] = d.Headers[k]
	}
	h[HeaderMessageID] = d.MessageID.String()
	h[HeaderTopic] = d.Topic
	h[HeaderCreatedAt] = d.CreatedAt.UTC().Format(time.RFC3339Nano)
	h[HeaderAttempt] = strconv.Itoa(d.Attempt)
	if d.OrderingKey != "" {
		h[HeaderOrderingKey] = d.OrderingKey
	}
	tracing.Propagator(nil).Inject(ctx, propagation.MapCarrier(h))
	return h, nil
}

// Redact returns the form of a broker URL that errors and logs may show: scheme, host and
// port, without credentials, path or query (see package internal/redact, which every
// error of the outbox that names a URL goes through).
func Redact(raw string) string { return redact.URL(raw) }
