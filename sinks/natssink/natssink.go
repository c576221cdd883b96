// Package natssink is the outbox's NATS JetStream sink (sink: nats): it publishes each
// message to a subject that a stream captures, with the message ID as Nats-Msg-Id, and
// returns when the stream has stored it (the publish ack).
//
// A resend of a message (after an ambiguous failure, or a second delivery run) carries the
// same Nats-Msg-Id, so the stream's duplicate window (Duplicates in the stream's config,
// two minutes by default) absorbs it: the consumer sees the message once. Keep the window
// longer than the delivery's retry schedule when consumers must never see a resend.
//
// The body is the payload; the metadata travels as headers (see package sinks).
package natssink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/sinks"
)

// DefaultSubject is the subject template when none is configured.
const DefaultSubject = "{topic}"

// Sink publishes a topic's messages to NATS JetStream. It implements activities.Handler,
// activities.Opener and io.Closer; its methods are safe for concurrent use.
type Sink struct {
	url     string
	subject sinks.Template
	headers map[string]string
	options []nats.Option

	mu     sync.Mutex
	conn   *nats.Conn
	js     jetstream.JetStream
	closed bool
}

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
			return fmt.Errorf("must be nats://host:port or tls://host:port (several separated by commas), got %q", redact(u))
		}
	}
	return nil
}

// New returns the sink of a topic's settings: URL, Subject (default "{topic}"), Headers,
// Username and Password, TLS. It does not connect; Open does.
func New(topic string, cfg activities.SinkConfig) (activities.Handler, error) {
	if err := CheckURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	subject, err := sinks.ParseTemplate(cmp.Or(cfg.Subject, DefaultSubject))
	if err != nil {
		return nil, fmt.Errorf("subject: %w", err)
	}
	for name := range cfg.Headers {
		if !validHeaderName(name) {
			return nil, fmt.Errorf("headers: %q is not a header name NATS carries: use letters, digits and !#$%%&'*+-.^_`|~", name)
		}
	}
	if err := sinks.NATSReserved.CheckConfig(cfg.Headers); err != nil {
		return nil, err
	}
	s := &Sink{url: cfg.URL, subject: subject, headers: cfg.Headers}
	s.options = []nats.Option{
		nats.Name("outbox " + cmp.Or(topic, "default")),
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
	js, err := s.jetStream()
	if err != nil {
		return err
	}
	if !s.subject.Static() {
		return nil
	}
	subject := s.subject.String()
	if _, err := js.StreamNameBySubject(ctx, subject); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("nats %s: no JetStream stream captures subject %q: add one (nats stream add --subjects %q) or change subject", redact(s.url), subject, subject)
		}
		return fmt.Errorf("nats %s: look up the stream of subject %q: %w", redact(s.url), subject, err)
	}
	return nil
}

// jetStream returns the connection's JetStream context, connecting first when needed.
func (s *Sink) jetStream() (jetstream.JetStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("the nats sink is closed")
	}
	if s.conn != nil && !s.conn.IsClosed() {
		return s.js, nil
	}
	// No connection yet, or the client closed it for good (an authorization error while
	// reconnecting, a protocol error): connect anew.
	nc, err := nats.Connect(s.url, s.options...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %s", redact(s.url), redactErr(err, s.url))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats %s: %w", redact(s.url), err)
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
func (s *Sink) Send(ctx context.Context, d activities.Delivery) error {
	subject, err := s.subject.Expand(d)
	if err != nil {
		return err
	}
	if err := checkSubject(subject); err != nil {
		return activities.Permanent(fmt.Errorf("subject %q of message %s: %w", subject, d.MessageID, err))
	}
	js, err := s.jetStream()
	if err != nil {
		return activities.Retryable(err, 0)
	}
	msg := nats.NewMsg(subject)
	msg.Data = d.Payload
	headers, err := sinks.Headers(ctx, d, s.headers, sinks.NATSReserved)
	if err != nil {
		return err
	}
	for k, v := range headers {
		if !validHeaderName(k) {
			return activities.Permanent(fmt.Errorf("message %s has header %q, which NATS cannot carry (allowed: letters, digits and !#$%%&'*+-.^_`|~)", d.MessageID, k))
		}
		msg.Header.Set(k, v)
	}
	msg.Header.Set("Content-Type", "application/json")
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(d.MessageID.String()))
	if err != nil {
		return s.classify(ctx, js, subject, err)
	}
	if ack.Duplicate {
		slog.DebugContext(ctx, "NATS stream already had the message", slog.String("message_id", d.MessageID.String()), slog.String("stream", ack.Stream))
	}
	return nil
}

// JetStream error codes the sink tells apart.
const (
	errCodeDuplicateInProcess = 10158 // the same Nats-Msg-Id is being stored right now
	errCodeMessageTooLarge    = 10054 // jetstream.JSErrCodeStreamMessageExceedsMaximum
	errCodeStreamSealed       = 10109 // the stream takes no more messages
)

// classify turns a failed publish into a handler error: nothing stored, stored in doubt,
// or a failure no retry fixes.
func (s *Sink) classify(ctx context.Context, js jetstream.JetStream, subject string, err error) error {
	failure := fmt.Errorf("nats publish to %q: %s", subject, redactErr(err, s.url))
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		// Nothing listens on the subject: either no stream captures it, or the stream is
		// between leaders (a restart). Only the first is permanent.
		lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, lerr := js.StreamNameBySubject(lookup, subject); errors.Is(lerr, jetstream.ErrStreamNotFound) {
			return activities.Permanent(fmt.Errorf("nats: no JetStream stream captures subject %q: add one or change the topic's subject", subject))
		}
		return activities.Retryable(failure, 0)
	case errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrConnectionReconnecting):
		// Refused while disconnected: the request never left this process.
		return activities.Retryable(failure, 0)
	case errors.Is(err, nats.ErrMaxPayload):
		return activities.Permanent(failure)
	case errors.Is(err, nats.ErrBadHeaderMsg):
		return activities.Permanent(fmt.Errorf("%w (a header name NATS does not allow)", failure))
	case errors.As(err, &apiErr):
		// The stream answered: it did not store the message, unless the same ID is
		// being stored by an earlier publish.
		switch apiErr.ErrorCode {
		case errCodeDuplicateInProcess:
			return activities.Ambiguous(failure)
		case errCodeMessageTooLarge, errCodeStreamSealed:
			return activities.Permanent(failure)
		default:
			// Limits, rate limits, storage full, a stream between leaders: retried until
			// the attempts run out, then dead-lettered with the reason.
			return activities.Retryable(failure, 0)
		}
	default:
		// A timeout, or a connection closed or lost after the publish went out: the
		// stream may have stored it. A resend is absorbed by the duplicate window.
		return activities.Ambiguous(failure)
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

// redact shows server URLs without credentials.
func redact(u string) string {
	parts := strings.Split(u, ",")
	for i, p := range parts {
		parts[i] = sinks.Redact(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// redactErr is err's text with the URLs' credentials, should the client quote them, cut
// out.
func redactErr(err error, u string) string {
	text := err.Error()
	for _, p := range strings.Split(u, ",") {
		p = strings.TrimSpace(p)
		if p != "" {
			text = strings.ReplaceAll(text, p, sinks.Redact(p))
		}
	}
	return text
}
