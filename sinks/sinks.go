// Package sinks holds what the sinks share. Each sink is a package of its own under
// sinks/ that implements delivery.Handler and depends on package delivery and this one,
// nothing above them: httpsink (sink: http, the default), natssink, rabbitsink and
// kafkasink. A topic delivered by a team's own activity, workflow or Nexus operation has
// no handler in the outbox's worker: the delivery workflow calls it (packages
// teamactivity, teamworkflow and teamnexus; the topic keys activity:, workflow: and
// nexus:). To add a sink, copy natssink: a
// Config of its own with its defaults, New, Send, and where it can, CheckProcessed, Open
// and Close; then run sinktest.Run against its real server.
//
// What the sinks share: how a handler's error reaches the delivery workflow from another
// process (ApplicationError); the templates of subjects, routing keys and topics; the headers
// every message carries (OutboxHeaders: Outbox-Message-Id, Outbox-Topic,
// Outbox-Created-At (RFC 3339), Outbox-Attempt, Outbox-Ordering-Key when the message has
// one); the headers a broker acts on, which no row may set ([Reserved]); and TLS files. A
// broker sink publishes the message's payload as the body (JSON, content type
// application/json), with the row's headers, the outbox's and the trace context
// (traceparent, tracestate) of the send span as headers.
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

	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
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
func (t Template) Expand(d delivery.Message) (string, error) {
	if t.usesOrdKey && d.OrderingKey == "" {
		return "", delivery.Permanent(fmt.Errorf("%q uses {ordering_key}, but message %s has no ordering key", t.text, d.MessageID))
	}
	if !t.placeholder {
		return t.text, nil
	}
	return strings.NewReplacer("{topic}", d.Topic, "{message_id}", d.MessageID, "{ordering_key}", d.OrderingKey).Replace(t.text), nil
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
func Headers(ctx context.Context, d delivery.Message, extra map[string]string, r Reserved) (map[string]string, error) {
	h := make(map[string]string, len(d.Headers)+len(extra)+7)
	for k, v := range extra {
		h[k] = v
	}
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		if err := r.Check(k); err != nil {
			return nil, delivery.Permanent(fmt.Errorf("message %s: %w; rename it in the row's headers", d.MessageID, err))
		}
		h[k] = d.Headers[k]
	}
	maps.Copy(h, OutboxHeaders(d))
	return tracing.Replace(ctx, h), nil
}

// OutboxHeaders returns the headers the outbox sets on every message a sink sends, the
// http sink's requests included: Outbox-Message-Id, Outbox-Topic, Outbox-Created-At (RFC
// 3339), Outbox-Attempt, and Outbox-Ordering-Key when m has one.
func OutboxHeaders(m delivery.Message) map[string]string {
	h := map[string]string{
		HeaderMessageID: m.MessageID,
		HeaderTopic:     m.Topic,
		HeaderCreatedAt: m.CreatedAt.UTC().Format(time.RFC3339Nano),
		HeaderAttempt:   strconv.Itoa(m.Attempt),
	}
	if m.OrderingKey != "" {
		h[HeaderOrderingKey] = m.OrderingKey
	}
	return h
}

// Spec is a topic's sink settings as a sink kind that a worker registers receives them
// (a topic whose sink: names that kind): the keys every sink may use, secrets read, and
// the topic's options: for the kind's own settings.
type Spec struct {
	// Kind is the topic's sink:.
	Kind string
	// URL is the topic's url:.
	URL string
	// Headers are the topic's headers:, secret references read.
	Headers map[string]string
	// Username and Password are the topic's username: and password: (read).
	Username string
	Password string
	// TLS is the topic's tls:.
	TLS TLSFiles
	// Options are the topic's options:, the kind's own settings.
	Options map[string]string
	// RetrySpan is the longest a resend of a message can come after its first send under
	// the topic's policy (see workflows.Policy.RetrySpan).
	RetrySpan time.Duration
}

// Factory builds the handler of a topic whose sink: names a kind a worker registers
// (app.Handlers.Sinks, config.Config.Registry). A handler that holds a connection may
// implement delivery.Opener and io.Closer.
type Factory func(topic string, s Spec) (delivery.Handler, error)

// ApplicationError returns a handler's error as the ApplicationError the delivery
// workflow reads: its kind as the type (delivery.ErrTypePermanent, not retryable;
// ErrTypeRetryable; ErrTypeAmbiguous) and its RetryAfter as the NextRetryDelay. An
// ApplicationError (a handler that speaks Temporal already) is returned as it is, unless
// a delivery mark wraps it (delivery.Permanent of an error from a Temporal call): the
// outermost of the two decides. nil stays nil. The result is never wrapped: wrapping
// would lose NonRetryable and NextRetryDelay.
func ApplicationError(err error) error {
	if err == nil {
		return nil
	}
	appErr, e := outermostMark(err)
	if appErr != nil {
		return appErr
	}
	if e == nil {
		return temporal.NewApplicationError(err.Error(), delivery.ErrTypeAmbiguous)
	}
	switch e.Kind {
	case delivery.KindPermanent:
		return temporal.NewNonRetryableApplicationError(err.Error(), delivery.ErrTypePermanent, nil)
	case delivery.KindRetryable:
		return temporal.NewApplicationErrorWithOptions(err.Error(), delivery.ErrTypeRetryable,
			temporal.ApplicationErrorOptions{NextRetryDelay: e.RetryAfter})
	default:
		return temporal.NewApplicationErrorWithOptions(err.Error(), delivery.ErrTypeAmbiguous,
			temporal.ApplicationErrorOptions{NextRetryDelay: e.RetryAfter})
	}
}

// outermostMark returns the first ApplicationError or delivery.Error in err's tree, in the
// order errors.As looks (err, then what it wraps, depth first): one of the two, or
// neither.
func outermostMark(err error) (*temporal.ApplicationError, *delivery.Error) {
	for err != nil {
		switch e := err.(type) {
		case *temporal.ApplicationError:
			return e, nil
		case *delivery.Error:
			return nil, e
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				if a, d := outermostMark(inner); a != nil || d != nil {
					return a, d
				}
			}
			return nil, nil
		}
		err = errors.Unwrap(err)
	}
	return nil, nil
}
