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
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outbox-go/outbox/internal/tlsfiles"
)

// Delivery is one send attempt of a message, as a handler receives it.
type Delivery struct {
	MessageID   uuid.UUID
	Topic       string
	Payload     json.RawMessage
	Headers     map[string]string
	OrderingKey string // empty when the message has none
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

// ErrConnectionLost marks a send that failed because the connection it was written on
// broke, not because of the message: a handler wraps it (fmt.Errorf("...: %w",
// ErrConnectionLost)) inside an Ambiguous or Retryable error, and the send activity counts
// it (outbox_send_connection_lost_total) besides the attempt's failure.
var ErrConnectionLost = errors.New("connection lost")

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

// SinkConfig is what a sink is built from: a topic's sink settings. config.Topic maps the
// file's keys onto it; a program may fill it directly.
type SinkConfig struct {
	// Sink names the kind: "http" (or empty) is built in, as are "nats", "rabbitmq" and
	// "kafka" when the sinks come from config.Registry; a worker may register others.
	Sink string
	// URL receives the http sink's POSTs; for nats and rabbitmq it is the broker's
	// address (nats://…, amqp://… or amqps://…), which may carry credentials.
	URL string
	// CheckURL, with {message_id} in it, answers 200 when the downstream already has a
	// message and 404 when it does not (http sink). Optional.
	CheckURL string
	// Headers are added to every request of the http sink, and to every message of the
	// broker sinks.
	Headers map[string]string

	// Subject is the NATS subject a message is published to (nats sink), a template over
	// {topic}, {message_id} and {ordering_key}.
	Subject string
	// Exchange and RoutingKey address a RabbitMQ message (rabbitmq sink): an empty
	// exchange is the default exchange, which routes by queue name. RoutingKey is a
	// template like Subject.
	Exchange   string
	RoutingKey string
	// Brokers are the Kafka seed brokers (host:port) and Topic the Kafka topic, a template
	// like Subject (kafka sink).
	Brokers []string
	Topic   string
	// Username and Password authenticate to a broker (nats: user and password; rabbitmq:
	// PLAIN; kafka: SASL/PLAIN), instead of credentials in the URL. Optional.
	Username string
	Password string `json:"-"`

	// TLS secures the connection to the http endpoint or the broker. Optional.
	TLS TLSFiles
	// SigningSecrets sign the http sink's requests by the Standard Webhooks convention
	// (webhook-id, webhook-timestamp, webhook-signature), one v1 signature per secret, so
	// a receiver can move to a new secret while the old one still verifies. Optional.
	SigningSecrets [][]byte `json:"-"`

	// Options holds the settings of sinks registered by a worker.
	Options map[string]string

	// RetrySpan is the longest a resend of a message can come after its first send (see
	// workflows.Policy.RetrySpan); a sink whose broker de-duplicates within a window warns
	// when the window is shorter. Zero when unknown.
	RetrySpan time.Duration
	// AllowPlaintextAuth lets the kafka sink send a SASL/PLAIN password without TLS. By
	// default username and password need TLS.
	AllowPlaintextAuth bool
}

// SinkFactory builds the handler of a topic from its sink settings. A handler that holds a
// connection may implement Opener, to connect (and so report a broker it cannot reach)
// when the worker starts, and io.Closer, to close it when the worker stops.
type SinkFactory func(topic string, cfg SinkConfig) (Handler, error)

// Opener is implemented by handlers that connect before the first message: Open is called
// when the worker starts. An error marked Permanent (a bad address, refused credentials, a
// missing stream, exchange or topic: what no retry fixes) stops the start. Any other (a
// broker that cannot be reached now) does not: the worker starts, reports the sink not
// ready, and calls Open again in the background until it succeeds, while the topic's
// sends fail and are retried as in any outage. Open must be safe to call again after it
// failed.
type Opener interface {
	Open(ctx context.Context) error
}

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

	// OnOpen, when set, is told each time a handler's Open succeeds (err nil) or fails
	// and will be tried again; name is the topic, or DefaultName. Set it before Open.
	OnOpen func(name string, err error)

	closed    bool
	opening   map[string]error // handlers not open yet, by name: the last failure
	reopenCtx context.Context
	stopOpen  context.CancelFunc
	opened    sync.WaitGroup
}

// ReopenInterval is how long the registry waits after a failed Open of a handler whose
// broker could not be reached before it calls Open again; OpenTimeout bounds each call.
var (
	ReopenInterval = 5 * time.Second
	OpenTimeout    = 30 * time.Second
)

// DefaultName is the name NotReady and OnOpen give the default handler (HandleDefault):
// no topic can be called that.
const DefaultName = "(default)"

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

// Open opens the handlers that implement Opener (see Opener), each once and all at once,
// so that a broker that does not answer does not use up another's time. It returns the
// permanent failures, by topic; a handler that failed otherwise is not ready (NotReady)
// and is opened again in the background, ReopenInterval after each failure, until it
// succeeds or Close is called.
func (r *Registry) Open(ctx context.Context) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, n := range r.handlers() {
		o, ok := n.handler.(Opener)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := o.Open(ctx)
			switch {
			case err == nil:
				r.report(n.label, nil)
			case IsPermanent(err):
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
				mu.Unlock()
			default:
				r.report(n.label, err)
				r.reopen(n.label, o)
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// report records the outcome of an Open of the handler called name.
func (r *Registry) report(name string, err error) {
	r.mu.Lock()
	if r.opening == nil {
		r.opening = map[string]error{}
	}
	if err == nil {
		delete(r.opening, name)
	} else {
		r.opening[name] = err
	}
	onOpen := r.OnOpen
	r.mu.Unlock()
	if onOpen != nil {
		onOpen(name, err)
	}
}

// reopen calls o.Open, ReopenInterval after each failure, until it succeeds or Close is
// called; each call may take OpenTimeout.
func (r *Registry) reopen(name string, o Opener) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	if r.stopOpen == nil {
		r.reopenCtx, r.stopOpen = context.WithCancel(context.Background())
	}
	ctx := r.reopenCtx
	r.opened.Add(1) // under mu, so that Close, which sets closed under mu, waits for it
	r.mu.Unlock()
	go func() {
		defer r.opened.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(ReopenInterval):
			}
			openCtx, cancel := context.WithTimeout(ctx, OpenTimeout)
			err := o.Open(openCtx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			r.report(name, err)
			if err == nil {
				return
			}
		}
	}()
}

// NotReady returns the handlers whose Open has not succeeded yet, by name (a topic, or
// DefaultName), with the last failure.
func (r *Registry) NotReady() map[string]error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return maps.Clone(r.opening)
}

// Close stops opening the handlers not open yet, and closes the handlers that implement
// io.Closer, each once.
func (r *Registry) Close() error {
	r.mu.Lock()
	r.closed = true
	stop := r.stopOpen
	r.mu.Unlock()
	if stop != nil {
		stop()
		r.opened.Wait()
	}
	var errs []error
	for _, n := range r.handlers() {
		if c, ok := n.handler.(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

type namedHandler struct {
	name    string // "topic <name>", or "default"
	label   string // "<name>", or DefaultName
	handler Handler
}

// handlers returns each handler once, by the first topic (sorted) it serves, the default
// handler last.
func (r *Registry) handlers() []namedHandler {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []namedHandler
	seen := map[Handler]bool{}
	add := func(name, label string, h Handler) {
		if reflect.TypeOf(h).Comparable() { // a HandlerFunc is not
			if seen[h] {
				return
			}
			seen[h] = true
		}
		out = append(out, namedHandler{name, label, h})
	}
	for _, topic := range slices.Sorted(maps.Keys(r.topics)) {
		add("topic "+topic, topic, r.topics[topic])
	}
	if r.fallback != nil {
		add("default", DefaultName, r.fallback)
	}
	return out
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

// TLSFiles secure a sink's connection: the CAs that sign the server's certificate
// (default: the system's roots) and a client certificate for mutual TLS, as PEM files.
type TLSFiles struct {
	// Enabled turns TLS on with the system's roots when nothing else is set: for kafka,
	// whose brokers have no scheme (nats and rabbitmq take TLS from tls:// and amqps://
	// too, http from https://).
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// IsZero reports whether no setting is given.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// Load reads the files and returns the client TLS configuration. Errors name the setting
// under "tls." and the file, never the file's contents.
func (f TLSFiles) Load() (*tls.Config, error) {
	return tlsfiles.Load("tls", tlsfiles.Files{
		CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		ServerName: f.ServerName, InsecureSkipVerify: f.InsecureSkipVerify,
	})
}
