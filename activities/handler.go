// Package activities holds the delivery workflow's activities (send, check-processed,
// mark-sent, dead-letter), the registry that maps a topic to its handler, and the
// built-in HTTP sink.
//
// # Topic handlers
//
// A topic handler is a [Handler]: it delivers one message, and returns nil when the
// downstream has it. It may also implement [Checker] to tell whether the downstream already
// processed a message, which the workflow asks before sending again after an ambiguous
// failure. A handler classifies its failures with [Permanent], [Retryable] and
// [Ambiguous]; any other error counts as ambiguous.
package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Delivery is one send attempt of a message, as a handler receives it.
type Delivery struct {
	MessageID   uuid.UUID
	Topic       string
	Payload     json.RawMessage
	Headers     map[string]string
	CreatedAt   time.Time
	Attempt     int // 1-based
	MaxAttempts int
}

// Handler delivers the messages of a topic.
type Handler interface {
	// Send delivers d. It must be safe to call again with the same message: d.MessageID
	// is the idempotency key the downstream de-duplicates by.
	Send(ctx context.Context, d Delivery) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, d Delivery) error

// Send calls f.
func (f HandlerFunc) Send(ctx context.Context, d Delivery) error { return f(ctx, d) }

// Checker is implemented by handlers that can ask the downstream whether it already
// processed a message. It returns ErrCheckUnsupported when it cannot tell.
type Checker interface {
	CheckProcessed(ctx context.Context, d Delivery) (processed bool, err error)
}

// ErrCheckUnsupported is returned by a Checker that cannot answer for a message.
var ErrCheckUnsupported = errors.New("check-processed is not supported")

// Failure kinds.
const (
	kindAmbiguous = iota
	kindRetryable
	kindPermanent
)

// HandlerError classifies a handler's failure. Build it with Permanent, Retryable or
// Ambiguous.
type HandlerError struct {
	Err        error
	RetryAfter time.Duration
	kind       int
}

func (e *HandlerError) Error() string { return e.Err.Error() }
func (e *HandlerError) Unwrap() error { return e.Err }

// Permanent marks err as a failure no retry can fix: the message is dead-lettered
// without further attempts.
func Permanent(err error) error { return &HandlerError{Err: err, kind: kindPermanent} }

// Retryable marks err as a failure the downstream reported without processing the
// message; the next attempt waits at least retryAfter when it is positive.
func Retryable(err error, retryAfter time.Duration) error {
	return &HandlerError{Err: err, RetryAfter: retryAfter, kind: kindRetryable}
}

// Ambiguous marks err as a failure after which the downstream may have the message; the
// workflow asks the handler's Checker before it sends again.
func Ambiguous(err error) error { return &HandlerError{Err: err, kind: kindAmbiguous} }

// IsPermanent reports whether err, or an error it wraps, was marked with Permanent.
func IsPermanent(err error) bool { return markOf(err) == kindPermanent }

// IsRetryable reports whether err, or an error it wraps, was marked with Retryable, and
// the least wait it asked for before the next attempt.
func IsRetryable(err error) (retryAfter time.Duration, ok bool) {
	var herr *HandlerError
	if !errors.As(err, &herr) || herr.kind != kindRetryable {
		return 0, false
	}
	return herr.RetryAfter, true
}

// IsAmbiguous reports whether err is a failure after which the downstream may have the
// message: one marked with Ambiguous, or one not marked at all, which the workflow treats
// the same way. A nil err is not a failure.
func IsAmbiguous(err error) bool { return err != nil && markOf(err) == kindAmbiguous }

// markOf returns the kind err was marked with; an unmarked error is ambiguous.
func markOf(err error) int {
	var herr *HandlerError
	if errors.As(err, &herr) {
		return herr.kind
	}
	return kindAmbiguous
}

// SinkConfig is what a sink is built from: a topic's sink settings.
type SinkConfig struct {
	// Sink names the kind: "http" (or empty) is built in; a worker may register others.
	Sink string
	// URL receives the http sink's POSTs.
	URL string
	// CheckURL, with {message_id} in it, answers 200 when the downstream already has a
	// message and 404 when it does not (http sink). Optional.
	CheckURL string
	// Headers are added to every request of the http sink.
	Headers map[string]string
	// Options holds the settings of sinks other than http.
	Options map[string]string
}

// SinkFactory builds the handler of a topic from its sink settings.
type SinkFactory func(topic string, cfg SinkConfig) (Handler, error)

// NewSink builds the handler of a topic's sink settings: the built-in http sink, or the
// sink kind sinks names.
func NewSink(topic string, cfg SinkConfig, sinks map[string]SinkFactory) (Handler, error) {
	if cfg.Sink == "" || cfg.Sink == "http" {
		return NewHTTPSink(cfg)
	}
	f, ok := sinks[cfg.Sink]
	if !ok {
		return nil, fmt.Errorf("unknown sink %q", cfg.Sink)
	}
	return f(topic, cfg)
}

// Registry maps topics to handlers. It is safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex
	topics   map[string]Handler
	fallback Handler
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{topics: map[string]Handler{}} }

// Handle sets the handler of topic.
func (r *Registry) Handle(topic string, h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.topics[topic] = h
}

// HandleDefault sets the handler of topics that have none of their own.
func (r *Registry) HandleDefault(h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fallback = h
}

// Lookup returns the handler of topic, or the default handler.
func (r *Registry) Lookup(topic string) (Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if h, ok := r.topics[topic]; ok {
		return h, true
	}
	return r.fallback, r.fallback != nil
}

// Topics returns the topics with a handler of their own, sorted.
func (r *Registry) Topics() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.topics))
	for t := range r.topics {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}
