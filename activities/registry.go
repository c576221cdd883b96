// Package activities holds the delivery workflow's activities (send, check-processed,
// mark-sent, dead-letter, load, signal-with-start, purge, and the batch's send-batch and
// mark-sent-all) and the [Registry] that maps a
// topic to its handler: a [delivery.Handler], the one contract every sink implements (see
// package delivery; the sinks are under sinks/).
package activities

import (
	"context"
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

	"github.com/outbox-go/outbox/delivery"
)

// Registry maps topics to handlers. It is safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex
	topics   map[string]delivery.Handler
	fallback delivery.Handler

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
func NewRegistry() *Registry { return &Registry{topics: map[string]delivery.Handler{}} }

// Handle sets the handler of topic.
func (r *Registry) Handle(topic string, h delivery.Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.topics[topic] = h
}

// HandleDefault sets the handler of topics that have none of their own.
func (r *Registry) HandleDefault(h delivery.Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fallback = h
}

// Lookup returns the handler of topic, or the default handler.
func (r *Registry) Lookup(topic string) (delivery.Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if h, ok := r.topics[topic]; ok {
		return h, true
	}
	return r.fallback, r.fallback != nil
}

// Open opens the handlers that implement delivery.Opener (see there), each once and all at once,
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
		o, ok := n.handler.(delivery.Opener)
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
			case delivery.IsPermanent(err):
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
func (r *Registry) reopen(name string, o delivery.Opener) {
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
	handler delivery.Handler
}

// handlers returns each handler once, by the first topic (sorted) it serves, the default
// handler last.
func (r *Registry) handlers() []namedHandler {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []namedHandler
	seen := map[delivery.Handler]bool{}
	add := func(name, label string, h delivery.Handler) {
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
