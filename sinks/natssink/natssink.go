// Package natssink is the outbox's NATS JetStream sink (sink: nats): it publishes each
// message to a subject that a stream captures, with the message ID as Nats-Msg-Id, and
// returns when the stream has stored it (the publish ack).
//
// A resend of a message (after an ambiguous failure, or a second delivery run) carries the
// same Nats-Msg-Id, so the stream's duplicate window (Duplicates in the stream's config,
// two minutes by default) absorbs it: the consumer sees the message once. Keep the window
// longer than the delivery's retry schedule when consumers must never see a resend: the
// sink reads the window of each stream it publishes to (at Open when the subject is the
// same for every message, else at the first publish the stream acknowledges) and logs a
// warning when it is shorter than the topic's retry span (activities.SinkConfig.RetrySpan).
//
// The body is the payload; the metadata travels as headers (see package sinks).
package natssink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/sinks"
)

// DefaultSubject is the subject template when none is configured.
const DefaultSubject = "{topic}"

// Sink publishes a topic's messages to NATS JetStream. It implements delivery.Handler,
// delivery.Opener and io.Closer; its methods are safe for concurrent use.
type Sink struct {
	topic     string
	url       string
	subject   sinks.Template
	headers   map[string]string
	options   []nats.Option
	retrySpan time.Duration // zero: unknown, the windows are not checked

	// dialing is held by the one caller that connects; the others wait for it, or for
	// their context.
	dialing chan struct{}

	mu     sync.Mutex
	conn   *nats.Conn
	js     jetstream.JetStream
	closed bool
	logger atomic.Pointer[slog.Logger] // nil: slog.Default()

	// denied are the subjects whose publishes the server refused for the user's
	// permissions, with when it last did: the server says so on the connection, not in
	// answer to the publish. inboxDenied is when it last refused a connection's
	// subscription to its reply inbox, through which no acknowledgement can then arrive.
	// deniedSignal is closed, and replaced, at each refusal, so a publish waiting for its
	// acknowledgement learns of it (see untilDenied).
	deniedMu     sync.Mutex
	denied       map[string]time.Time
	inboxDenied  time.Time
	deniedSignal chan struct{}

	windows    sync.Mutex           // guards what follows
	checked    map[string]bool      // streams whose window was read, or is being read
	shortfalls map[string]Shortfall // by stream
}

// Shortfall is a stream whose duplicate window is shorter than the retry span of the
// topic that publishes to it: a resend later than the window after the first publish is
// stored again, and consumers see the message twice.
type Shortfall struct {
	Stream    string
	Window    time.Duration // the stream's Duplicates
	RetrySpan time.Duration // the topic's
}

// windowCheckTimeout bounds the look-up of a stream's duplicate window.
const windowCheckTimeout = 5 * time.Second

// CheckURL checks the url setting: one or more nats:// or tls:// server URLs, separated by
// commas. The error shows the URLs without credentials.
func CheckURL(u string) error {
	if strings.TrimSpace(u) == "" {
		return errors.New("must be set: the NATS server's URL, such as nats://127.0.0.1:4222")
	}
	for _, one := range strings.Split(u, ",") {
		one = strings.TrimSpace(one)
		scheme, rest, ok := strings.Cut(one, "://")
		host := rest
		if i := strings.LastIndex(host, "@"); i >= 0 {
			host = host[i+1:]
		}
		if !ok || (scheme != "nats" && scheme != "tls") || host == "" || strings.ContainsAny(host, "/?#") {
			return fmt.Errorf("must be nats://host:port or tls://host:port (several separated by commas), got %q", redact.URLs(u))
		}
	}
	return nil
}

// Config is a nats topic's sink settings: the keys of a topic with sink: nats.
type Config struct {
	// URL is the NATS server's (nats://host:4222, tls:// for TLS; several,
	// comma-separated, for a cluster). It may carry credentials. Required.
	URL string
	// Subject is the subject a message is published to, a template over {topic},
	// {message_id} and {ordering_key}. Defaults to "{topic}".
	Subject string
	// Headers are added to every message; none may be reserved (see sinks.NATSReserved).
	Headers map[string]string
	// Username and Password authenticate instead of credentials in the URL. Optional.
	Username string
	Password string
	// TLS secures the connection. Optional.
	TLS sinks.TLSFiles
	// RetrySpan is the longest a resend can come after the first send (see
	// workflows.Policy.RetrySpan): the sink warns when the stream's duplicate window is
	// shorter. Zero when unknown.
	RetrySpan time.Duration
}

// New returns the sink of a topic's settings: URL, Subject (default "{topic}"), Headers,
// Username and Password, TLS. It does not connect; Open does.
func New(topic string, cfg Config) (delivery.Handler, error) {
	if err := CheckURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	subject, err := sinks.ParseTemplate(cmp.Or(cfg.Subject, DefaultSubject))
	if err != nil {
		return nil, fmt.Errorf("subject: %w", err)
	}
	// The subject's fixed part (and the topic, for a listed topic) as any message fills
	// it: one that no message could be published to is a setting to fix, not a reason to
	// dead-letter every message of the topic.
	sample, _ := subject.Expand(delivery.Message{Topic: cmp.Or(topic, "t"), MessageID: "m", OrderingKey: "k"})
	if err := checkSubject(sample); err != nil {
		return nil, fmt.Errorf("subject: %q (for topic %q) cannot be published to: %w", subject, cmp.Or(topic, "any"), err)
	}
	for name := range cfg.Headers {
		if !validHeaderName(name) {
			return nil, fmt.Errorf("headers: %q is not a header name NATS carries: use letters, digits and !#$%%&'*+-.^_`|~", name)
		}
	}
	if err := sinks.NATSReserved.CheckConfig(cfg.Headers); err != nil {
		return nil, err
	}
	s := &Sink{
		topic: topic, url: cfg.URL, subject: subject, headers: cfg.Headers, retrySpan: cfg.RetrySpan,
		checked: map[string]bool{}, shortfalls: map[string]Shortfall{}, denied: map[string]time.Time{},
		deniedSignal: make(chan struct{}), dialing: make(chan struct{}, 1),
	}
	s.options = []nats.Option{
		nats.Name("outbox " + cmp.Or(topic, "default")),
		nats.ErrorHandler(s.asyncError),
		// Reconnect for as long as the worker runs; while disconnected, a publish fails at
		// once (nothing buffered), so the attempt is retried rather than left in doubt.
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectBufSize(-1),
		// An authorization error while reconnecting (credentials being rotated) does
		// not close the connection for good.
		nats.IgnoreAuthErrorAbort(),
	}
	if cfg.Username != "" || cfg.Password != "" {
		s.options = append(s.options, nats.UserInfo(cfg.Username, cfg.Password))
	}
	if !cfg.TLS.IsZero() {
		tlsCfg, err := cfg.TLS.Load()
		if err != nil {
			return nil, err
		}
		s.options = append(s.options, nats.Secure(tlsCfg))
	}
	return s, nil
}

// Open connects to the server and, when the subject is the same for every message,
// checks that a stream captures it.
func (s *Sink) Open(ctx context.Context) error {
	js, err := s.jetStream(ctx)
	if err != nil {
		return err
	}
	if !s.subject.Static() {
		return nil
	}
	subject := s.subject.String()
	stream, err := js.StreamNameBySubject(ctx, subject)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return delivery.Permanent(fmt.Errorf("nats %s: no JetStream stream captures subject %q: add one (nats stream add --subjects %q) or change subject", redact.URLs(s.url), subject, subject))
		}
		return fmt.Errorf("nats %s: look up the stream of subject %q: %w", redact.URLs(s.url), subject, err)
	}
	s.checkWindow(ctx, js, stream)
	return nil
}

// SetLogger sets the logger of the sink's warnings; nil, the default, is slog.Default().
func (s *Sink) SetLogger(l *slog.Logger) { s.logger.Store(l) }

func (s *Sink) log() *slog.Logger {
	if l := s.logger.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// DuplicateWindowShortfalls returns the streams found so far whose duplicate window is
// shorter than the topic's retry span, by name.
func (s *Sink) DuplicateWindowShortfalls() []Shortfall {
	s.windows.Lock()
	defer s.windows.Unlock()
	out := make([]Shortfall, 0, len(s.shortfalls))
	for _, f := range s.shortfalls {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Shortfall) int { return strings.Compare(a.Stream, b.Stream) })
	return out
}

// checkWindow reads the duplicate window of stream, once, and warns when it is shorter
// than the topic's retry span. It never fails the caller: a look-up that fails is logged,
// and tried again later only when ctx ended it.
func (s *Sink) checkWindow(ctx context.Context, js jetstream.JetStream, stream string) {
	if s.retrySpan <= 0 || stream == "" {
		return
	}
	s.windows.Lock()
	if s.checked[stream] {
		s.windows.Unlock()
		return
	}
	s.checked[stream] = true
	s.windows.Unlock()

	lookup, cancel := context.WithTimeout(ctx, windowCheckTimeout)
	defer cancel()
	st, err := js.Stream(lookup, stream)
	if err != nil {
		if ctx.Err() != nil {
			s.windows.Lock()
			delete(s.checked, stream)
			s.windows.Unlock()
			return
		}
		s.log().WarnContext(ctx, "cannot read the duplicate window of the NATS stream; a resend later than the window after the first publish is stored again",
			slog.String("topic", s.topic), slog.String("stream", stream), slog.Duration("retry_span", s.retrySpan), slog.String("error", redact.Error(err, s.url)))
		return
	}
	window := st.CachedInfo().Config.Duplicates
	if window >= s.retrySpan {
		return
	}
	s.windows.Lock()
	s.shortfalls[stream] = Shortfall{Stream: stream, Window: window, RetrySpan: s.retrySpan}
	s.windows.Unlock()
	s.log().WarnContext(ctx, "the NATS stream's duplicate window is shorter than the topic's retry span: a resend later than the window after the first publish is stored again, and consumers see the message twice",
		slog.String("topic", s.topic), slog.String("stream", stream),
		slog.Duration("duplicate_window", window), slog.Duration("retry_span", s.retrySpan),
		slog.String("fix", fmt.Sprintf("nats stream edit %s --dupe-window %s, or lower the topic's max_attempts or max_interval", stream, roundUp(s.retrySpan))))
}

// roundUp shows d rounded up to the minute, as a duration the nats CLI reads ("25m",
// "1h30m").
func roundUp(d time.Duration) string {
	d = (d + time.Minute - 1).Truncate(time.Minute)
	text := d.String()
	text = strings.TrimSuffix(text, "0s")
	if strings.HasSuffix(text, "h0m") {
		text = strings.TrimSuffix(text, "0m")
	}
	return text
}

// asyncError handles an error the server sent on the connection: a refused publish, or a
// refused subscription to the connection's reply inbox, is recorded for the classification
// of the sends it concerns (see denial), and every error is logged, as the client's
// default handler prints it.
func (s *Sink) asyncError(c *nats.Conn, _ *nats.Subscription, err error) {
	if subject, ok := deniedSubject(err, "publish"); ok {
		s.deniedMu.Lock()
		if len(s.denied) >= maxDenied {
			// A subject per message (a template over {message_id}): keep the memory
			// bounded; a refusal forgotten makes its send ambiguous, as before.
			clear(s.denied)
		}
		s.denied[subject] = time.Now()
		close(s.deniedSignal)
		s.deniedSignal = make(chan struct{})
		s.deniedMu.Unlock()
	}
	if subject, ok := deniedSubject(err, "subscription"); ok && strings.HasPrefix(subject, nats.InboxPrefix) {
		s.deniedMu.Lock()
		s.inboxDenied = time.Now()
		close(s.deniedSignal)
		s.deniedSignal = make(chan struct{})
		s.deniedMu.Unlock()
		// The client keeps the refused subscription as if it were in place and never asks
		// again, so this connection gets no acknowledgement even after the permission is
		// granted: the next send connects anew, and asks again.
		s.retire(c)
	}
	s.log().Warn("NATS server error on the connection", slog.String("topic", s.topic), slog.String("error", redact.Error(err, s.url)))
}

// retire closes c and makes the next send connect anew, if c is the sink's connection.
func (s *Sink) retire(c *nats.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c == nil || s.conn != c {
		return
	}
	s.conn, s.js = nil, nil
	go c.Close() // outside the client's callback, which runs this
}

// maxDenied bounds how many refused subjects a sink remembers.
const maxDenied = 1024

// deniedSubject returns the subject of a publish or a subscription (op) the server
// refused for the user's permissions ("Permissions Violation for Publish to
// \"orders.created\"", "... for Subscription to \"_INBOX.x.*\"").
func deniedSubject(err error, op string) (string, bool) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return "", false
	}
	msg := err.Error()
	marker := op + ` to "`
	i := strings.Index(strings.ToLower(msg), marker)
	if i < 0 {
		return "", false
	}
	rest := msg[i+len(marker):]
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return "", false
	}
	return rest[:j], true
}

// denial returns a permanent failure when the server refused a publish to subject for the
// user's permissions since began; an ambiguous one, which says so, when it refused the
// connection's reply inbox since began (the publish went out, and its acknowledgement
// cannot come back); or nil.
func (s *Sink) denial(subject string, began time.Time) error {
	_, err := s.denialOrSignal(subject, began)
	return err
}

// denialOrSignal is denial, and the channel closed at the next refusal when there is none.
func (s *Sink) denialOrSignal(subject string, began time.Time) (<-chan struct{}, error) {
	s.deniedMu.Lock()
	at, ok := s.denied[subject]
	inbox := s.inboxDenied
	signal := s.deniedSignal
	s.deniedMu.Unlock()
	switch {
	case ok && !at.Before(began):
		return nil, delivery.Permanent(fmt.Errorf("nats: the server refused the publish to %q: the connection's user has no permission to publish to it (the topic's username, or the server's permissions)", subject))
	case !inbox.IsZero() && !inbox.Before(began):
		return nil, delivery.Ambiguous(fmt.Errorf("nats publish to %q: the server refused the connection's user a subscription to its reply inbox (%s>), so the stream's acknowledgement cannot arrive and the stream may have the message: allow the user to subscribe to %s> (the topic's username, or the server's permissions)",
			subject, nats.InboxPrefix, nats.InboxPrefix))
	}
	return signal, nil
}

// errDenied ends the wait of a publish the server refused, or whose acknowledgement it
// refused to let come back (the reply inbox).
var errDenied = errors.New("the server refused the publish or its reply inbox")

// untilDenied returns ctx, cancelled with errDenied as soon as the server refuses a
// publish to subject, or the connection's reply inbox, after began. The refusal comes on
// the connection, not as the publish's answer, so without it the publish would wait for an
// acknowledgement until the attempt ends. stop releases it.
func (s *Sink) untilDenied(ctx context.Context, subject string, began time.Time) (_ context.Context, stop func()) {
	pubCtx, cancel := context.WithCancelCause(ctx)
	go func() {
		for {
			signal, denied := s.denialOrSignal(subject, began)
			if denied != nil {
				cancel(errDenied)
				return
			}
			select {
			case <-signal:
			case <-pubCtx.Done():
				return
			}
		}
	}()
	return pubCtx, func() { cancel(nil) }
}

// current returns the JetStream context of the sink's open connection, nil when it has
// none, or an error after Close.
func (s *Sink) current() (jetstream.JetStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("the nats sink is closed")
	}
	if s.conn != nil && !s.conn.IsClosed() {
		return s.js, nil
	}
	return nil, nil
}

// jetStream returns the connection's JetStream context, connecting first when needed. One
// caller connects at a time, within its context's deadline; the others wait for it, or
// for their own context.
func (s *Sink) jetStream(ctx context.Context) (jetstream.JetStream, error) {
	if js, err := s.current(); js != nil || err != nil {
		return js, err
	}
	select {
	case s.dialing <- struct{}{}:
		defer func() { <-s.dialing }()
	case <-ctx.Done():
		return nil, fmt.Errorf("connect to nats %s: %w", redact.URLs(s.url), context.Cause(ctx))
	}
	if js, err := s.current(); js != nil || err != nil {
		return js, err // connected while this caller waited
	}
	// No connection yet, or the client closed it for good (an authorization error while
	// reconnecting, a protocol error): connect anew.
	opts := s.options
	if deadline, ok := ctx.Deadline(); ok {
		if left := time.Until(deadline); left < nats.DefaultTimeout {
			opts = append(slices.Clip(opts), nats.Timeout(max(left, time.Millisecond)))
		}
	}
	nc, err := nats.Connect(s.url, opts...)
	if err != nil {
		failure := fmt.Errorf("connect to nats %s: %s", redact.URLs(s.url), redact.Error(err, s.url))
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
			// Refused credentials: no retry of Open fixes them (Send retries anyway, for
			// credentials being rotated).
			return nil, delivery.Permanent(failure)
		}
		return nil, failure
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats %s: %w", redact.URLs(s.url), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		nc.Close()
		return nil, errors.New("the nats sink is closed")
	}
	s.conn, s.js = nc, js
	return js, nil
}

// Close closes the connection.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.conn != nil {
		s.conn.Close()
		s.conn, s.js = nil, nil
	}
	return nil
}

// Send publishes the message and waits for the stream's ack. A publish the stream had
// already stored (the same Nats-Msg-Id inside the duplicate window) counts as delivered.
func (s *Sink) Send(ctx context.Context, d delivery.Message) error {
	msg, err := s.build(ctx, d)
	if err != nil {
		return err
	}
	js, err := s.jetStream(ctx)
	if err != nil {
		return delivery.Retryable(err, 0)
	}
	began := time.Now()
	pubCtx, stop := s.untilDenied(ctx, msg.Subject, began)
	ack, err := js.PublishMsg(pubCtx, msg, jetstream.WithMsgID(d.MessageID))
	stop()
	if err != nil {
		return s.classify(ctx, js, msg.Subject, began, err)
	}
	s.acked(ctx, js, d, ack)
	return nil
}

// build is the NATS message of d: its subject, payload and headers.
func (s *Sink) build(ctx context.Context, d delivery.Message) (*nats.Msg, error) {
	subject, err := s.subject.Expand(d)
	if err != nil {
		return nil, err
	}
	if err := checkSubject(subject); err != nil {
		return nil, delivery.Permanent(fmt.Errorf("subject %q of message %s: %w", subject, d.MessageID, err))
	}
	msg := nats.NewMsg(subject)
	msg.Data = d.Payload
	headers, err := sinks.Headers(ctx, d, s.headers, sinks.NATSReserved)
	if err != nil {
		return nil, err
	}
	for k, v := range headers {
		if !validHeaderName(k) {
			return nil, delivery.Permanent(fmt.Errorf("message %s has header %q, which NATS cannot carry (allowed: letters, digits and !#$%%&'*+-.^_`|~)", d.MessageID, k))
		}
		msg.Header.Set(k, v)
	}
	msg.Header.Set("Content-Type", "application/json")
	return msg, nil
}

// acked notes a stored message: a duplicate the stream dropped, and, once per stream, the
// stream's duplicate window (Open checked the stream of a static subject already).
func (s *Sink) acked(ctx context.Context, js jetstream.JetStream, d delivery.Message, ack *jetstream.PubAck) {
	if ack.Duplicate {
		s.log().DebugContext(ctx, "NATS stream already had the message", slog.String("message_id", d.MessageID), slog.String("stream", ack.Stream))
	}
	s.checkWindow(ctx, js, ack.Stream)
}

// SendBatch publishes msgs together (the batch lane, delivery.BatchHandler): every message
// goes out at once as an asynchronous JetStream publish with its Nats-Msg-Id, and the
// acknowledgements are awaited together, so the batch costs about one round trip. Each
// message's outcome is classified as Send's: a message the attempt ends before its
// acknowledgement came is ambiguous (the stream may have it; its duplicate window drops a
// resend).
func (s *Sink) SendBatch(ctx context.Context, msgs []delivery.Message) []error {
	errs := make([]error, len(msgs))
	js, err := s.jetStream(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = delivery.Retryable(err, 0)
		}
		return errs
	}
	futures := make([]jetstream.PubAckFuture, len(msgs))
	began := time.Now()
	for i, d := range msgs {
		msg, err := s.build(ctx, d)
		if err != nil {
			errs[i] = err
			continue
		}
		futures[i], err = js.PublishMsgAsync(msg, jetstream.WithMsgID(d.MessageID))
		switch {
		case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
			// Refused before it went out: too many publishes wait for their acks.
			errs[i] = delivery.Retryable(fmt.Errorf("nats publish to %q: %w", msg.Subject, err), 0)
		case err != nil:
			errs[i] = s.classify(ctx, js, msg.Subject, began, err)
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		errs[i] = s.await(ctx, js, f, msgs[i], began)
	}
	return errs
}

// await waits for the acknowledgement of a batch's publish f of d, until the attempt ends
// or the server refuses a publish to its subject, and classifies the outcome as Send does.
func (s *Sink) await(ctx context.Context, js jetstream.JetStream, f jetstream.PubAckFuture, d delivery.Message, began time.Time) error {
	for {
		if ok, err := s.answer(ctx, js, f, d, began); ok {
			return err
		}
		signal, denied := s.denialOrSignal(f.Msg().Subject, began)
		if denied != nil {
			return denied
		}
		select {
		case ack := <-f.Ok():
			s.acked(ctx, js, d, ack)
			return nil
		case err := <-f.Err():
			return s.classify(ctx, js, f.Msg().Subject, began, err)
		case <-signal:
		case <-ctx.Done():
			// An answer that came as the attempt ended still counts.
			if ok, err := s.answer(ctx, js, f, d, began); ok {
				return err
			}
			if denied := s.denial(f.Msg().Subject, began); denied != nil {
				return denied
			}
			return delivery.Ambiguous(fmt.Errorf("nats publish to %q: no acknowledgement before the attempt ended (%w); the stream may have the message",
				f.Msg().Subject, context.Cause(ctx)))
		}
	}
}

// answer is the outcome of f when its answer has come (ok), without waiting for one.
func (s *Sink) answer(ctx context.Context, js jetstream.JetStream, f jetstream.PubAckFuture, d delivery.Message, began time.Time) (ok bool, err error) {
	select {
	case ack := <-f.Ok():
		s.acked(ctx, js, d, ack)
		return true, nil
	case err := <-f.Err():
		return true, s.classify(ctx, js, f.Msg().Subject, began, err)
	default:
		return false, nil
	}
}

// JetStream error codes the sink tells apart.
const (
	errCodeDuplicateInProcess = 10158 // the same Nats-Msg-Id is being stored right now
	errCodeMessageTooLarge    = 10054 // jetstream.JSErrCodeStreamMessageExceedsMaximum
	errCodeHeadersTooLarge    = 10097 // the headers exceed the 64 KiB JetStream allows
	errCodeStreamSealed       = 10109 // the stream takes no more messages
)

// classify turns a failed publish into a handler error: nothing stored, stored in doubt,
// or a failure no retry fixes.
func (s *Sink) classify(ctx context.Context, js jetstream.JetStream, subject string, began time.Time, err error) error {
	failure := fmt.Errorf("nats publish to %q: %s", subject, redact.Error(err, s.url))
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		// Nothing listens on the subject: either no stream captures it, or the stream is
		// between leaders (a restart). Only the first is permanent.
		lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, lerr := js.StreamNameBySubject(lookup, subject); errors.Is(lerr, jetstream.ErrStreamNotFound) {
			return delivery.Permanent(fmt.Errorf("nats: no JetStream stream captures subject %q: add one or change the topic's subject", subject))
		}
		return delivery.Retryable(failure, 0)
	case errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrConnectionReconnecting):
		// Refused while disconnected: the request never left this process.
		return delivery.Retryable(failure, 0)
	case errors.Is(err, nats.ErrMaxPayload):
		return delivery.Permanent(failure)
	case errors.Is(err, nats.ErrBadHeaderMsg):
		return delivery.Permanent(fmt.Errorf("%w (a header name NATS does not allow)", failure))
	case errors.As(err, &apiErr):
		// The stream answered: it did not store the message, unless the same ID is
		// being stored by an earlier publish.
		switch apiErr.ErrorCode {
		case errCodeDuplicateInProcess:
			return delivery.Ambiguous(failure)
		case errCodeMessageTooLarge, errCodeHeadersTooLarge, errCodeStreamSealed:
			return delivery.Permanent(failure)
		default:
			// Limits, rate limits, storage full, a stream between leaders: retried until
			// the attempts run out, then dead-lettered with the reason.
			return delivery.Retryable(failure, 0)
		}
	default:
		if denied := s.denial(subject, began); denied != nil {
			// The server refused the publish (and said so on the connection): nothing
			// was stored, and no retry passes until the permissions change. Or it refused
			// the reply inbox: the stream may have stored it, and the error says why no
			// acknowledgement came.
			return denied
		}
		// A timeout, or a connection closed or lost after the publish went out: the
		// stream may have stored it. A resend is absorbed by the duplicate window.
		return delivery.Ambiguous(failure)
	}
}

// checkSubject refuses what a subject cannot hold (an empty token, white space, a
// wildcard), as a template filled with an unusual ordering key may produce.
func checkSubject(subject string) error {
	if strings.ContainsAny(subject, " \t\r\n*>") {
		return errors.New("a subject cannot contain white space, * or >")
	}
	for _, token := range strings.Split(subject, ".") {
		if token == "" {
			return errors.New("a subject cannot have an empty token (leading, trailing or double dot)")
		}
	}
	return nil
}

// validHeaderName reports whether name is an HTTP token, which is what a NATS header name
// may be.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
