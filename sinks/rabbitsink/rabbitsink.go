// Package rabbitsink is the RabbitMQ sink of the outbox (sink: rabbitmq): it publishes each
// message to an exchange with a routing key, and reports it delivered only once the broker
// has confirmed it.
//
// A message is published persistent (delivery mode 2), with the message ID as the AMQP
// message_id property, the payload as the body (content type application/json), the
// message's creation time as the timestamp, and the headers of [sinks.Headers] as the
// headers table. Publishing is mandatory and on confirm-mode channels: a message the
// exchange routes to no queue comes back to the sink, which fails the send permanently with
// a reason that names the exchange and the routing key, rather than letting the broker drop
// it.
//
// A sink holds one connection and a small pool of channels, each carrying one publish at a
// time, so that a returned message and the confirm that follows it on a channel belong to
// the same send. When the broker closes the connection (a restart, a forced close, a lost
// network) the next send dials again; a channel the broker closed is dropped from the pool.
//
// The channels of a connection share its writer. A send whose context ends while its
// message is being written (a broker that stopped reading, a slow network) fails as
// ambiguous, and its connection is retired rather than broken: later sends dial a new
// one, while the publishes already in flight on the retired connection keep their
// channels and get their confirms; the retired connection is closed once they are done,
// or after a bound (retireTimeout). The write of the failed send goes on in the
// background, so the broker may yet get its message.
//
// Failures are classified for the delivery workflow: nothing sent (no connection, the
// broker blocks publishers) is retryable; a connection lost or a context done between the
// publish and its confirm, and a nack (a message routed to several queues is nacked when
// one refuses it, though the others may have queued it), are ambiguous: the broker may
// have the message; a message the broker refused for good (unroutable, missing exchange,
// access refused, precondition failed such as a message over the size limit) is
// permanent. A send that failed because its connection broke, not because of its message,
// wraps [delivery.ErrConnectionLost].
package rabbitsink

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/sinks"
)

// DefaultRoutingKey is the routing key template of a sink whose routing_key is empty: the
// topic, which the default exchange routes to the queue of that name.
const DefaultRoutingKey = "{topic}"

const (
	// maxChannels bounds the channels, and so the publishes in flight, of one sink. A send
	// beyond it waits for a channel to come back to the pool.
	maxChannels = 16
	// dialTimeout bounds the TCP connect and the TLS and AMQP handshakes of a dial, unless
	// the caller's context ends first.
	dialTimeout = 30 * time.Second
	// closeTimeout bounds the connection.close handshake of Close, and of the close of a
	// retired connection.
	closeTimeout = 10 * time.Second
	// retireTimeout bounds the life of a retired connection: the publishes still in flight
	// on it then fail (ambiguous), and the write of a send that ended mid-write is cut.
	retireTimeout = time.Minute
	// cutTimeout bounds the close of a retired connection at its bound or at Close, whose
	// writer may be stuck.
	cutTimeout = time.Second
	// maxShortstr is the longest exchange name, routing key or header name AMQP can carry.
	maxShortstr = 255
)

// ErrClosed is wrapped, as a retryable failure, by the error of a Send after Close.
var ErrClosed = errors.New("rabbitmq: the sink is closed")

// Sink publishes a topic's messages to RabbitMQ. Build it with New; it is safe for
// concurrent use. Open connects it ahead of the first message, and Close disconnects it.
type Sink struct {
	url        string // as configured, credentials included: never shown
	shown      string // url without credentials, path or query, for errors
	exchange   string
	routingKey sinks.Template
	headers    map[string]string
	config     amqp.Config              // everything a dial needs but Dial and TLSClientConfig
	tls        *tls.Config              // nil for plain TCP; cloned for each dial
	slots      chan struct{}            // one token per Send or Open that holds a channel
	dialing    chan struct{}            // held by the one Send or Open that dials
	retireFor  time.Duration            // retireTimeout, shorter in tests
	mu         sync.Mutex               // guards what follows, and the fields of connection it names
	conn       *connection              // the connection new publishes use; nil before a dial, after Close
	idle       []*pubChannel            // channels of conn that no publish uses
	retired    map[*connection]struct{} // retired connections not closed yet
	closed     bool
}

// connection is an AMQP connection of the sink, with the state the sink keeps beside it.
type connection struct {
	amqp *amqp.Connection
	net  net.Conn               // the TCP connection under it
	stop atomic.Pointer[string] // the broker's reason while it blocks publishers
	// Guarded by Sink.mu.
	inflight int         // publishes that hold one of its channels
	retired  bool        // it takes no new publish, and is closed once inflight is 0
	limit    *time.Timer // closes it retireTimeout after it was retired
}

// pubChannel is a confirm-mode channel of the pool, with the notifications of the one
// publish that uses it at a time.
type pubChannel struct {
	ch      *amqp.Channel
	conn    *connection
	returns chan amqp.Return // messages the broker returned as unroutable
	closes  chan *amqp.Error // the reason the channel closed, if not by the sink
}

// Config is a rabbitmq topic's sink settings: the keys of a topic with sink: rabbitmq.
type Config struct {
	// URL is the broker's (amqp://host:5672/vhost, or amqps:// for TLS). It may carry
	// credentials. Required.
	URL string
	// Exchange is the exchange messages are published to. Defaults to "", the default
	// exchange, which routes by queue name.
	Exchange string
	// RoutingKey is a template over {topic}, {message_id} and {ordering_key}. Defaults to
	// "{topic}".
	RoutingKey string
	// Headers are added to every message; none may be reserved (see
	// sinks.RabbitMQReserved).
	Headers map[string]string
	// Username and Password authenticate with PLAIN instead of the URL's credentials.
	// Optional.
	Username string
	Password string
	// TLS secures an amqps:// connection. Optional.
	TLS sinks.TLSFiles
}

// New returns the sink of a topic's rabbitmq settings: url (amqp:// or amqps://),
// exchange (empty: the default exchange), routing_key (a template, default {topic}),
// headers, username and password (PLAIN authentication instead of the URL's credentials)
// and tls (used for amqps://). It checks the settings and reads the TLS files but does not
// connect: Open or the first Send does. Errors name the setting at fault and never show
// credentials.
func New(topic string, cfg Config) (delivery.Handler, error) {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}
	urlOK, secure := false, false
	if err := CheckURL(cfg.URL); err != nil {
		bad("url", "%v", err)
	} else {
		u, _ := url.Parse(cfg.URL)
		urlOK, secure = true, u.Scheme == "amqps"
	}
	key := cmp.Or(cfg.RoutingKey, DefaultRoutingKey)
	tmpl, err := sinks.ParseTemplate(key)
	switch {
	case err != nil:
		bad("routing_key", "%v", err)
	case tmpl.Static() && len(key) > maxShortstr:
		bad("routing_key", "must be at most %d bytes, got %d", maxShortstr, len(key))
	}
	if len(cfg.Exchange) > maxShortstr {
		bad("exchange", "must be at most %d bytes, got %d", maxShortstr, len(cfg.Exchange))
	}
	for name := range cfg.Headers {
		if len(name) > maxShortstr {
			bad("headers", "header name %.32q... must be at most %d bytes, got %d", name, maxShortstr, len(name))
		}
		if err := sinks.RabbitMQReserved.Check(name); err != nil {
			bad("headers", "%v", err)
		}
	}
	if cfg.Password != "" && cfg.Username == "" {
		bad("username", "must be set with password")
	}
	var tlsConfig *tls.Config
	if !cfg.TLS.IsZero() && urlOK && !secure {
		bad("tls", "is set, but url %s does not use TLS: use amqps://", redact.URL(cfg.URL))
	}
	if secure || !cfg.TLS.IsZero() {
		// Load's errors name the setting (tls.ca_file ...) already.
		if tlsConfig, err = cfg.TLS.Load(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outbox " + topic)
	config := amqp.Config{Properties: props}
	if cfg.Username != "" {
		config.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: cfg.Username, Password: cfg.Password}}
	}
	return &Sink{
		url:        cfg.URL,
		shown:      redact.URL(cfg.URL),
		exchange:   cfg.Exchange,
		routingKey: tmpl,
		headers:    cfg.Headers,
		config:     config,
		tls:        tlsConfig,
		slots:      make(chan struct{}, maxChannels),
		dialing:    make(chan struct{}, 1),
		retireFor:  retireTimeout,
		retired:    map[*connection]struct{}{},
	}, nil
}

// CheckURL checks a broker URL: amqp:// or amqps:// with a host. Its errors show the URL
// without credentials.
func CheckURL(raw string) error {
	if raw == "" {
		return errors.New("must be set: the broker's amqp:// or amqps:// URL")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Hostname() == "" {
		return fmt.Errorf("must be an amqp:// or amqps:// URL with a host, got %q", redact.URL(raw))
	}
	// A # or ? in a password that is not percent-encoded ends the host early: the URL
	// would parse with the user name as its host and the password's digits as its port,
	// which connection errors then show.
	if strings.Contains(raw, "#") || (u.User == nil && strings.Contains(u.RawQuery, "@")) {
		return fmt.Errorf("must be an amqp:// or amqps:// URL whose user name and password percent-encode # (%%23), ? (%%3F), / (%%2F) and @ (%%40), got %q",
			redact.URL(raw))
	}
	// The URL parses, so ParseURI's errors are about its port, query options or spaces,
	// and do not quote it.
	if _, err := amqp.ParseURI(raw); err != nil {
		return fmt.Errorf("must be a valid amqp:// or amqps:// URL, got %q: %v", redact.URL(raw), err)
	}
	return nil
}

// Open connects to the broker and opens a first channel, so that a broker the worker
// cannot reach, or credentials it refuses, stop the worker's start. When the sink
// publishes to a named exchange, Open also checks that the exchange exists.
func (s *Sink) Open(ctx context.Context) error {
	c, err := s.acquire(ctx)
	if err != nil {
		if errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost) || errors.Is(err, amqp.ErrSASL) {
			return delivery.Permanent(err) // refused credentials or vhost: no retry of Open fixes them
		}
		return err
	}
	conn := c.conn
	s.release(c, true)
	<-s.slots
	if s.exchange == "" {
		return nil
	}
	// The client's Channel and ExchangeDeclarePassive take no context: a broker that
	// stops answering would hold Open (and the worker's start, or its Close) with them.
	checked := make(chan error, 1)
	go func() { checked <- s.checkExchange(conn) }()
	select {
	case err := <-checked:
		return err
	case <-ctx.Done():
		return delivery.Retryable(fmt.Errorf("rabbitmq: check exchange %q on %s: %w", s.exchange, s.shown, ctx.Err()), 0)
	}
}

// checkExchange reports whether the sink's exchange exists, on a channel of its own: a
// passive declare that fails closes its channel.
func (s *Sink) checkExchange(conn *connection) error {
	ch, err := conn.amqp.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: open a channel on %s: %w", s.shown, err)
	}
	defer func() { _ = ch.Close() }()
	if err := ch.ExchangeDeclarePassive(s.exchange, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return delivery.Permanent(fmt.Errorf("rabbitmq: exchange %q not found on %s (%w): declare it, or fix exchange", s.exchange, s.shown, brokerError{aerr}))
		}
		return fmt.Errorf("rabbitmq: check exchange %q on %s: %w", s.exchange, s.shown, err)
	}
	return nil
}

// Send publishes d and waits for the broker's confirm. See the package documentation for
// how its failures are classified.
func (s *Sink) Send(ctx context.Context, d delivery.Message) error {
	key, err := s.routingKey.Expand(d)
	if err != nil {
		return err // permanent already
	}
	if len(key) > maxShortstr {
		return delivery.Permanent(fmt.Errorf("rabbitmq: routing key %.32q... of message %s is %d bytes, more than the %d AMQP allows: fix routing_key",
			key, d.MessageID, len(key), maxShortstr))
	}
	headers, err := sinks.Headers(ctx, d, s.headers, sinks.RabbitMQReserved)
	if err != nil {
		return err
	}
	table := make(amqp.Table, len(headers))
	for name, v := range headers {
		if len(name) > maxShortstr {
			return delivery.Permanent(fmt.Errorf("rabbitmq: header name %.32q... of message %s is %d bytes, more than the %d AMQP allows",
				name, d.MessageID, len(name), maxShortstr))
		}
		table[name] = v
	}
	msg := amqp.Publishing{
		Headers:      table,
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    d.MessageID,
		Timestamp:    d.CreatedAt,
		Body:         d.Payload,
	}

	c, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer func() { <-s.slots }()
	return s.publish(ctx, c, key, msg)
}

// frameOverhead is what an AMQP frame adds to its payload: its type, channel and size, and
// its end octet.
const frameOverhead = 8

// headerFrameSize is the size of the payload of msg's content header frame, which the
// client writes whole, however large (it splits only the body): the class, weight, body
// size and property flags, and the properties the sink sets (a table of string headers).
// It errs long by a few bytes rather than short.
func headerFrameSize(msg amqp.Publishing) int {
	n := 2 + 2 + 8 + 2                                             // class, weight, body size, property flags
	n += 1 + len(msg.ContentType) + 1 + 8 + 1 + len(msg.MessageId) // content type, delivery mode, timestamp, message ID
	n += 4                                                         // the table's size
	for k, v := range msg.Headers {
		s, _ := v.(string)               // Send sets string values only
		n += 1 + len(k) + 1 + 4 + len(s) // the name, the value's type, length and text
	}
	return n
}

// publish publishes msg on c and waits for its confirm, then gives c back with release
// (itself, or once the write ends when ctx ended during it).
func (s *Sink) publish(ctx context.Context, c *pubChannel, key string, msg amqp.Publishing) (err error) {
	keep, owned := false, true // keep: c is open and owes no confirm
	defer func() {
		if owned {
			s.release(c, keep)
		}
	}()
	if reason := c.conn.stop.Load(); reason != nil {
		// The broker would not read the message until its alarm clears.
		keep = true
		return delivery.Retryable(fmt.Errorf("rabbitmq: %s blocks publishers (%s)", s.shown, *reason), 0)
	}
	if frame, limit := headerFrameSize(msg), c.conn.amqp.Config.FrameSize; limit > 0 && frame > limit-frameOverhead {
		// The client would write it all the same, and the broker would close the
		// connection (501 frame_too_large), failing every publish in flight on it.
		keep = true
		return delivery.Permanent(fmt.Errorf("rabbitmq: the properties and headers of message %s take %d bytes, more than the %d bytes of a frame the broker takes (frame_max %d): send fewer or shorter headers",
			msg.MessageId, frame, limit-frameOverhead, limit))
	}
	drain(c.returns)
	if err := ctx.Err(); err != nil {
		keep = true
		return delivery.Retryable(fmt.Errorf("rabbitmq: publish to %s on %s: %w", s.where(key), s.shown, err), 0)
	}
	// The client writes without a deadline, on a writer the channels of the connection
	// share: a broker that stopped reading (an alarm not yet announced) would hold the
	// publish past the attempt. So the write runs on its own, and if ctx ends before it
	// is done, the send fails and the connection is retired: a deadline would break the
	// writes and the confirms of every other publish on it.
	written := make(chan publishResult, 1)
	go func() {
		dc, err := c.ch.PublishWithDeferredConfirm(s.exchange, key, true, false, msg)
		written <- publishResult{dc, err}
	}()
	var r publishResult
	select {
	case r = <-written:
	case <-ctx.Done():
		s.retire(c.conn)
		owned = false
		go func() {
			<-written
			s.release(c, false) // it may owe a confirm
		}()
		return delivery.Ambiguous(fmt.Errorf("rabbitmq: publish to %s on %s: %w while the message was being written; the broker may get it, and later sends use a new connection",
			s.where(key), s.shown, ctx.Err()))
	}
	if err := r.err; err != nil {
		failure := fmt.Errorf("rabbitmq: publish to %s on %s: %w", s.where(key), s.shown, err)
		if errors.Is(err, amqp.ErrClosed) {
			// Refused before one of its frames was written (the channel or connection was
			// closed, perhaps by the failed write of an earlier frame): the broker drops a
			// message whose frames did not all arrive, so it cannot have this one.
			if c.conn.amqp.IsClosed() {
				failure = fmt.Errorf("rabbitmq: publish to %s on %s: %w: %w", s.where(key), s.shown, delivery.ErrConnectionLost, err)
			}
			return delivery.Retryable(failure, 0)
		}
		// A write error: the connection's writer is shared, and another publish's flush
		// may have put this message on the wire before the error.
		return delivery.Ambiguous(fmt.Errorf("rabbitmq: publish to %s on %s: %w: %w", s.where(key), s.shown, delivery.ErrConnectionLost, err))
	}
	acked, err := r.dc.WaitContext(ctx)
	if err != nil {
		// The confirm may still come, on a channel no other publish may now use.
		return delivery.Ambiguous(fmt.Errorf("rabbitmq: no confirm from %s for the message published to %s: %w", s.shown, s.where(key), err))
	}
	if !acked {
		select {
		case aerr := <-c.closes:
			// The channel closed, which resolves every pending confirm as a nack; the
			// channel reports why before it does.
			return s.closedError(c.conn, aerr, key)
		default:
			// A message routed to several queues is nacked when one of them refuses it,
			// though the others may have queued it.
			keep = true
			return delivery.Ambiguous(fmt.Errorf("rabbitmq: %s nacked the message published to %s (a queue refused it)", s.shown, s.where(key)))
		}
	}
	// The client hands a basic.return to NotifyReturn before it processes the ack that
	// follows it, so a return for this message is buffered by now.
	for {
		select {
		case r, ok := <-c.returns:
			if !ok {
				return nil
			}
			if r.MessageId != msg.MessageId {
				continue // not this publish's: cannot happen with one publish per channel
			}
			keep = true
			return delivery.Permanent(s.returnedError(r))
		default:
			keep = true
			return nil
		}
	}
}

// publishResult is the outcome of writing a message.
type publishResult struct {
	dc  *amqp.DeferredConfirmation
	err error
}

// where names the destination of a publish with the routing key key.
func (s *Sink) where(key string) string {
	if s.exchange == "" {
		return fmt.Sprintf("the default exchange with routing key %q", key)
	}
	return fmt.Sprintf("exchange %q with routing key %q", s.exchange, key)
}

// returnedError describes a message the broker returned.
func (s *Sink) returnedError(r amqp.Return) error {
	fix := "bind a queue that matches, or fix routing_key"
	by := fmt.Sprintf("exchange %q", r.Exchange)
	if r.Exchange == "" {
		fix = fmt.Sprintf("declare a queue named %q, or fix routing_key", r.RoutingKey)
		by = "the default exchange"
	}
	return fmt.Errorf("rabbitmq: message returned unroutable (%d %s) by %s with routing key %q: %s",
		r.ReplyCode, r.ReplyText, by, r.RoutingKey, fix)
}

// closedError classifies the closing of a channel of conn between a publish and its
// confirm: aerr is the reason, the broker's or the client's, or nil when the sink closed
// the connection.
func (s *Sink) closedError(conn *connection, aerr *amqp.Error, key string) error {
	if aerr == nil {
		s.mu.Lock()
		retired := conn.retired
		s.mu.Unlock()
		if retired {
			// Closed at the end of its bound, the connection did not serve the publish.
			return delivery.Ambiguous(fmt.Errorf("rabbitmq: connection to %s closed, retired, before the broker confirmed the message published to %s: %w",
				s.shown, s.where(key), delivery.ErrConnectionLost))
		}
		return delivery.Ambiguous(fmt.Errorf("rabbitmq: connection to %s closed before the broker confirmed the message published to %s", s.shown, s.where(key)))
	}
	berr := brokerError{aerr}
	switch aerr.Code {
	case amqp.NotFound:
		if s.exchange == "" {
			return delivery.Permanent(fmt.Errorf("rabbitmq: %s refused the message published to %s (%w)", s.shown, s.where(key), berr))
		}
		return delivery.Permanent(fmt.Errorf("rabbitmq: exchange %q not found on %s (%w): declare it, or fix exchange", s.exchange, s.shown, berr))
	case amqp.AccessRefused:
		return delivery.Permanent(fmt.Errorf("rabbitmq: %s refused to let the user publish to %s (%w): grant write permission, or fix username", s.shown, s.where(key), berr))
	case amqp.PreconditionFailed:
		return delivery.Permanent(fmt.Errorf("rabbitmq: %s rejected the message published to %s (%w)", s.shown, s.where(key), berr))
	default:
		if conn.amqp.IsClosed() {
			// The connection closed (the client marks it before it closes its channels):
			// a lost network, a broker restart, a forced close.
			return delivery.Ambiguous(fmt.Errorf("rabbitmq: %w to %s (%w) before the broker confirmed the message published to %s; it may have the message",
				delivery.ErrConnectionLost, s.shown, berr, s.where(key)))
		}
		return delivery.Ambiguous(fmt.Errorf("rabbitmq: %s closed the channel before it confirmed the message published to %s (%w); it may have the message", s.shown, s.where(key), berr))
	}
}

// brokerError shows an AMQP exception as its code and the broker's text ("404 NOT_FOUND -
// no exchange ..."), and unwraps to it.
type brokerError struct{ err *amqp.Error }

func (e brokerError) Error() string { return fmt.Sprintf("%d %s", e.err.Code, e.err.Reason) }
func (e brokerError) Unwrap() error { return e.err }

// Close closes the connection, and with it every channel, and the retired connections not
// closed yet; a publish still waiting for its confirm fails as ambiguous, and a Send after
// Close fails as retryable.
func (s *Sink) Close() error {
	s.mu.Lock()
	conn := s.conn
	retired := make([]*connection, 0, len(s.retired))
	for r := range s.retired {
		r.limit.Stop()
		retired = append(retired, r)
	}
	s.closed, s.conn, s.idle, s.retired = true, nil, nil, nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range retired {
		wg.Go(func() { closeConnection(r, cutTimeout) })
	}
	defer wg.Wait()
	if conn == nil || conn.amqp.IsClosed() {
		return nil
	}
	if err := conn.amqp.CloseDeadline(time.Now().Add(closeTimeout)); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("rabbitmq: close the connection to %s: %w", s.shown, err)
	}
	return nil
}

// acquire returns a channel for one publish: an idle one of the pool, or a new one,
// connecting first if the sink has no open connection. It takes a slot, which the caller
// gives back, and counts the publish in flight on the channel's connection until
// release. Its errors are retryable: nothing was sent.
func (s *Sink) acquire(ctx context.Context) (*pubChannel, error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, delivery.Retryable(fmt.Errorf("rabbitmq: wait for a channel to %s: %w", s.shown, ctx.Err()), 0)
	}
	conn, err := s.connect(ctx)
	if err != nil {
		<-s.slots
		return nil, err
	}
	s.mu.Lock()
	for len(s.idle) > 0 {
		c := s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		if c.conn == conn && !c.ch.IsClosed() {
			s.mu.Unlock()
			return c, nil
		}
		discard(c)
	}
	s.mu.Unlock()
	c, err := openChannel(ctx, conn)
	if err != nil {
		// The connection may be broken before it knows (a write error shuts it down in
		// the background), or its writer stuck: retire it, which closes it once the
		// publishes on it are done, and try once more on a new one.
		s.retire(conn)
		s.done(conn)
		if ctx.Err() != nil {
			<-s.slots
			return nil, delivery.Retryable(fmt.Errorf("rabbitmq: open a channel on %s: %w", s.shown, err), 0)
		}
		if conn, err = s.connect(ctx); err != nil {
			<-s.slots
			return nil, err
		}
		if c, err = openChannel(ctx, conn); err != nil {
			s.done(conn)
		}
	}
	if err != nil {
		<-s.slots
		return nil, delivery.Retryable(fmt.Errorf("rabbitmq: open a channel on %s: %w", s.shown, err), 0)
	}
	return c, nil
}

// release ends the publish on a channel acquire returned: it puts the channel back in the
// pool when keep is set and it is still open on the current connection, and closes a
// retired connection when this was its last publish. It leaves the slot to the caller.
func (s *Sink) release(c *pubChannel, keep bool) {
	s.mu.Lock()
	if keep && !s.closed && c.conn == s.conn && !c.ch.IsClosed() {
		c.conn.inflight--
		s.idle = append(s.idle, c)
		s.mu.Unlock()
		return
	}
	retired := c.conn.retired
	s.mu.Unlock()
	if !retired {
		discard(c)
	}
	// A retired connection closes its channels with itself.
	s.done(c.conn)
}

// done counts a publish on conn out, and closes conn when it is retired and this was its
// last publish.
func (s *Sink) done(conn *connection) {
	s.mu.Lock()
	conn.inflight--
	last := conn.retired && conn.inflight == 0
	if last {
		if _, ok := s.retired[conn]; !ok {
			last = false // closed already, at its bound or by Close
		}
		delete(s.retired, conn)
	}
	s.mu.Unlock()
	if last {
		conn.limit.Stop()
		go closeConnection(conn, closeTimeout)
	}
}

// retire stops conn from taking new publishes; the ones in flight on it keep their
// channels. It is closed when the last of them ends, or after retireFor.
func (s *Sink) retire(conn *connection) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if conn.retired {
		return
	}
	conn.retired = true
	if s.conn == conn {
		s.conn, s.idle = nil, nil // the idle channels close with the connection
	}
	if s.closed {
		return // Close has closed it, or will
	}
	if conn.inflight == 0 {
		go closeConnection(conn, closeTimeout)
		return
	}
	s.retired[conn] = struct{}{}
	conn.limit = time.AfterFunc(s.retireFor, func() {
		s.mu.Lock()
		_, ok := s.retired[conn]
		delete(s.retired, conn)
		s.mu.Unlock()
		if ok {
			closeConnection(conn, cutTimeout)
		}
	})
}

// closeConnection closes a connection the sink no longer uses, within timeout, which also
// ends a write in progress.
func closeConnection(conn *connection, timeout time.Duration) {
	if !conn.amqp.IsClosed() {
		_ = conn.amqp.CloseDeadline(time.Now().Add(timeout))
	}
}

// connect returns the sink's open connection, dialing when it has none or the one it had
// was closed, and counts a publish in flight on it. One caller dials at a time; the others
// wait for it, or for their context.
func (s *Sink) connect(ctx context.Context) (*connection, error) {
	if conn, err := s.current(); conn != nil || err != nil {
		return conn, err
	}
	select {
	case s.dialing <- struct{}{}:
		defer func() { <-s.dialing }()
	case <-ctx.Done():
		return nil, delivery.Retryable(fmt.Errorf("rabbitmq: connect to %s: %w", s.shown, ctx.Err()), 0)
	}
	if conn, err := s.current(); conn != nil || err != nil {
		return conn, err // dialed while this caller waited
	}
	conn, err := s.dial(ctx)
	if err != nil {
		return nil, delivery.Retryable(fmt.Errorf("rabbitmq: connect to %s: %w", s.shown, err), 0)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = conn.amqp.Close()
		return nil, delivery.Retryable(ErrClosed, 0)
	}
	for _, c := range s.idle {
		discard(c)
	}
	s.conn, s.idle = conn, nil
	conn.inflight++
	return conn, nil
}

// current returns the sink's connection if it is open, counting a publish in flight on
// it, nil if there is none, and an error after Close.
func (s *Sink) current() (*connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, delivery.Retryable(ErrClosed, 0)
	}
	if s.conn != nil && !s.conn.amqp.IsClosed() {
		s.conn.inflight++
		return s.conn, nil
	}
	return nil, nil
}

// dial opens a connection. ctx bounds the TCP connect and the handshakes, not the
// connection's life.
func (s *Sink) dial(ctx context.Context) (*connection, error) {
	conn := &connection{}
	config := s.config
	if s.tls != nil {
		config.TLSClientConfig = s.tls.Clone() // the client fills in ServerName
	}
	var stop func() bool
	config.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: dialTimeout}
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// The client clears the deadline once the AMQP handshake is done.
		deadline := time.Now().Add(dialTimeout)
		if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
			deadline = dl
		}
		if err := nc.SetDeadline(deadline); err != nil {
			_ = nc.Close()
			return nil, err
		}
		stop = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
		conn.net = nc
		return nc, nil
	}
	c, err := amqp.DialConfig(s.url, config)
	if stop != nil && !stop() && err == nil {
		// ctx ended during the handshake; its deadline may hit the connection yet.
		_ = c.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	conn.amqp = c
	blocks := c.NotifyBlocked(make(chan amqp.Blocking, 1))
	go func() {
		// Ends when the connection closes, which closes blocks.
		for b := range blocks {
			if b.Active {
				reason := cmp.Or(b.Reason, "resource alarm")
				conn.stop.Store(&reason)
			} else {
				conn.stop.Store(nil)
			}
		}
	}()
	return conn, nil
}

// openChannel opens a confirm-mode channel on conn, unless ctx ends first (the writer of
// conn may be stuck behind another publish): a channel opened after that is closed.
func openChannel(ctx context.Context, conn *connection) (*pubChannel, error) {
	type result struct {
		c   *pubChannel
		err error
	}
	opened := make(chan result, 1)
	go func() {
		c, err := openConfirmChannel(conn)
		opened <- result{c, err}
	}()
	select {
	case r := <-opened:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-opened; r.err == nil {
				_ = r.c.ch.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// openConfirmChannel opens a confirm-mode channel on conn.
func openConfirmChannel(conn *connection) (*pubChannel, error) {
	ch, err := conn.amqp.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return &pubChannel{
		ch:   ch,
		conn: conn,
		// One publish at a time gets at most one return; the slack keeps the client's
		// reader from ever waiting on this channel.
		returns: ch.NotifyReturn(make(chan amqp.Return, 4)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// discard closes a channel the pool no longer wants, without waiting for the broker.
func discard(c *pubChannel) {
	if !c.ch.IsClosed() {
		go func() { _ = c.ch.Close() }()
	}
}

// drain empties a notification channel without blocking.
func drain[T any](ch <-chan T) {
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		default:
			return
		}
	}
}
