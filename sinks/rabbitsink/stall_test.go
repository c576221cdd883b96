package rabbitsink_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/rabbitsink"
)

// proxy forwards TCP connections to the broker, and can stall either direction of a
// connection, or cut it, as a broker that stops reading or a lost network would.
type proxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	links    []*link
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	up, down       gate // client to broker, broker to client
	closed         chan struct{}
	once           sync.Once
}

// gate holds back a direction of a link while it is stalled.
type gate struct {
	mu sync.Mutex
	c  chan struct{} // nil while open; closed when the stall ends
}

func (g *gate) stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c == nil {
		g.c = make(chan struct{})
	}
}

func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c != nil {
		close(g.c)
		g.c = nil
	}
}

func (g *gate) wait(closed <-chan struct{}) {
	g.mu.Lock()
	c := g.c
	g.mu.Unlock()
	if c != nil {
		select {
		case <-c:
		case <-closed:
		}
	}
}

func newProxy(t *testing.T) *proxy {
	t.Helper()
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	upstream := u.Host
	if u.Port() == "" {
		upstream = net.JoinHostPort(u.Hostname(), "5672")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, upstream: upstream}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.links {
			l.cut()
		}
	})
	return p
}

// url is the broker's URL with the proxy in place of the broker.
func (p *proxy) url() string {
	u, _ := url.Parse(brokerURL())
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		// A small receive buffer, so that a stalled direction soon stops the sender.
		_ = client.(*net.TCPConn).SetReadBuffer(16 << 10)
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		l := &link{client: client, server: server, closed: make(chan struct{})}
		p.mu.Lock()
		p.links = append(p.links, l)
		p.mu.Unlock()
		go l.pipe(server, client, &l.up)
		go l.pipe(client, server, &l.down)
	}
}

func (l *link) pipe(dst, src net.Conn, g *gate) {
	buf := make([]byte, 16<<10)
	for {
		g.wait(l.closed)
		n, err := src.Read(buf)
		g.wait(l.closed) // what came in as the stall began waits too
		if l.isClosed() {
			break // a cut drops what the stall held back, as a broken connection would
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	l.cut()
}

// cut closes both sides of the link.
func (l *link) cut() {
	l.once.Do(func() {
		close(l.closed)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

func (l *link) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

// link returns the i-th connection the proxy accepted, waiting for it a little.
func (p *proxy) link(i int) *link {
	p.t.Helper()
	var l *link
	eventually(p.t, 5*time.Second, "the proxy accepts a connection", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.links) > i {
			l = p.links[i]
		}
		return l != nil
	})
	return l
}

func (p *proxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// bigDelivery is a message larger than the socket buffers between the sink and a stalled
// proxy, so that its write blocks.
func bigDelivery(topic string) delivery.Message {
	d := testMessage(topic, -1)
	d.Payload = json.RawMessage(`"` + strings.Repeat("x", 8<<20) + `"`)
	return d
}

// TestAWriteThatOutlivesItsAttemptSparesTheOtherPublishes: a send whose attempt ends while
// its message is being written fails alone; the publishes waiting on the same connection's
// writer get their confirms once the broker reads again, a send after it uses a new
// connection, and every confirmed message is queued once.
func TestAWriteThatOutlivesItsAttemptSparesTheOtherPublishes(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("stall", "", nil)
	p := newProxy(t)
	s := newSink(t, q, rabbitsink.Config{URL: p.url()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 8
	// A channel for each publish, so that they all are on the wire at once.
	if err := s.OpenChannels(ctx, n+1); err != nil {
		t.Fatal(err)
	}
	if idle := s.IdleChannels(); idle != n+1 {
		t.Fatalf("%d idle channels, want %d", idle, n+1)
	}
	first := p.link(0)
	first.up.stall()

	big := bigDelivery(q)
	bigErr := sendBlocked(t, s, big, 1500*time.Millisecond)

	// Publishes on other channels of the connection, behind the blocked write.
	others := make(map[string]bool, n)
	errs := make(chan error, n)
	for i := range n {
		d := testMessage(q, i)
		others[d.MessageID] = true
		go func() { errs <- s.Send(ctx, d) }()
	}

	err := <-bigErr
	if !delivery.IsAmbiguous(err) {
		t.Fatalf("send whose attempt ended mid-write: got %v, want an ambiguous error", err)
	}
	if errors.Is(err, delivery.ErrConnectionLost) {
		t.Errorf("send whose own attempt ended: %v, want no ErrConnectionLost", err)
	}
	t.Logf("attempt ended mid-write: %v", err)

	// The connection is retired, not broken: a send now uses a new one, while the first
	// is still stalled, and the publishes on the first are still waiting.
	late := testMessage(q, n)
	if err := s.Send(ctx, late); err != nil {
		t.Fatalf("send after the retirement: %v", err)
	}
	if p.count() != 2 || first.isClosed() {
		t.Fatalf("%d connections, the first closed: %v; want a second one beside the stalled first", p.count(), first.isClosed())
	}
	select {
	case err := <-errs:
		t.Fatalf("a publish behind the stalled write returned while the broker did not read: %v", err)
	default:
	}

	first.up.resume()
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("publish on the retired connection: %v", err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	eventually(t, 10*time.Second, "the retired connection is closed once its publishes are done", func() bool {
		return first.isClosed() && s.RetiredConnections() == 0
	})

	// Every confirmed message once; the one whose send failed at most once.
	deliveries, err := b.ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	want := n + 1
	timeout := time.After(10 * time.Second)
	for len(seen) < want || seen[big.MessageID] > 0 && len(seen) < want+1 {
		select {
		case m := <-deliveries:
			seen[m.MessageId]++
		case <-timeout:
			t.Fatalf("consumed %v, want the %d confirmed messages", seen, want)
		}
	}
	// A duplicate, or the failed send's message, would be queued by now.
	time.Sleep(200 * time.Millisecond)
	for more := true; more; {
		select {
		case m := <-deliveries:
			seen[m.MessageId]++
		default:
			more = false
		}
	}
	for id := range others {
		if seen[id] != 1 {
			t.Errorf("message %s queued %d times, want once", id, seen[id])
		}
	}
	if c := seen[late.MessageID]; c != 1 {
		t.Errorf("message sent after the retirement queued %d times, want once", c)
	}
	if c := seen[big.MessageID]; c > 1 {
		t.Errorf("message whose send failed queued %d times, want at most once", c)
	}
	t.Logf("the message whose send failed was queued %d times", seen[big.MessageID])
}

// TestARetiredConnectionIsClosedAtItsBound: a retired connection whose broker never reads
// again is closed at its bound; the publish still waiting on it fails, marked as lost to
// the connection.
func TestARetiredConnectionIsClosedAtItsBound(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("bound", "", nil)
	p := newProxy(t)
	s := newSink(t, q, rabbitsink.Config{URL: p.url()})
	s.SetRetireTimeout(500 * time.Millisecond)
	ctx := ctxFor(t)
	if err := s.OpenChannels(ctx, 2); err != nil {
		t.Fatal(err)
	}
	p.link(0).up.stall()
	bigErr := sendBlocked(t, s, bigDelivery(q), time.Second)
	otherErr := make(chan error, 1)
	go func() { otherErr <- s.Send(ctx, testMessage(q, 0)) }()

	if err := <-bigErr; !delivery.IsAmbiguous(err) {
		t.Fatalf("send whose attempt ended mid-write: got %v, want an ambiguous error", err)
	}
	start := time.Now()
	err := <-otherErr
	t.Logf("publish on the retired connection, %v after the retirement: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil || delivery.IsPermanent(err) || !errors.Is(err, delivery.ErrConnectionLost) {
		t.Fatalf("publish on a retired connection that never drained: got %v, want a failure that is retried, wrapping ErrConnectionLost", err)
	}
	eventually(t, 5*time.Second, "the retired connection is closed", func() bool { return s.RetiredConnections() == 0 })
	if err := s.Send(ctx, testMessage(q, 1)); err != nil {
		t.Fatalf("send on a new connection: %v", err)
	}
}

// TestASendDoesNotWaitPastItsAttemptForAChannel: a send that needs a new channel on a
// connection whose writer is stuck fails, as retryable, when its attempt ends.
func TestASendDoesNotWaitPastItsAttemptForAChannel(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("channel", "", nil)
	p := newProxy(t)
	s := newSink(t, q, rabbitsink.Config{URL: p.url()})
	ctx := ctxFor(t)
	if err := s.Open(ctx); err != nil { // one channel in the pool
		t.Fatal(err)
	}
	p.link(0).up.stall()
	bigErr := sendBlocked(t, s, bigDelivery(q), time.Second)

	start := time.Now()
	otherCtx, otherCancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer otherCancel()
	err := s.Send(otherCtx, testMessage(q, 0))
	took := time.Since(start)
	t.Logf("send that waited for a channel, after %v: %v", took.Round(time.Millisecond), err)
	if _, ok := delivery.IsRetryable(err); !ok {
		t.Errorf("got %v, want a retryable error", err)
	}
	if took > 3*time.Second {
		t.Errorf("the send took %v, past its attempt of 1.5s", took)
	}
	if err := <-bigErr; !delivery.IsAmbiguous(err) {
		t.Errorf("send whose attempt ended mid-write: got %v, want an ambiguous error", err)
	}
	if err := s.Send(ctx, testMessage(q, 1)); err != nil {
		t.Fatalf("send on a new connection: %v", err)
	}
}

// TestABrokenConnectionMarksItsPublishesLost: publishes that fail because their connection
// broke, waiting for a confirm or in the middle of a write, wrap ErrConnectionLost.
func TestABrokenConnectionMarksItsPublishesLost(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	q := b.queue("lost", "", nil)
	p := newProxy(t)
	s := newSink(t, q, rabbitsink.Config{URL: p.url()})
	ctx := ctxFor(t)
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}

	for i, tc := range []struct {
		name  string
		stall func(*link)
		d     delivery.Message
	}{
		{"waiting for the confirm", func(l *link) { l.down.stall() }, testMessage(q, 0)},
		{"in the middle of a write", func(l *link) { l.up.stall() }, bigDelivery(q)},
	} {
		// Every link the proxy has carried: a slow machine may have dialed more than one.
		p.link(i)
		p.mu.Lock()
		links := slices.Clone(p.links)
		p.mu.Unlock()
		for _, l := range links {
			tc.stall(l)
		}
		errc := make(chan error, 1)
		go func() { errc <- s.Send(ctx, tc.d) }()
		time.Sleep(300 * time.Millisecond)
		for _, l := range links {
			l.cut()
		}
		err := <-errc
		t.Logf("%s: %v", tc.name, err)
		// A write the break interrupts is ambiguous; a message one of whose frames the
		// closed connection refused is not (the broker drops an incomplete message).
		_, retryable := delivery.IsRetryable(err)
		refused := retryable && errors.Is(err, amqp.ErrClosed)
		if !(delivery.IsAmbiguous(err) || i == 1 && refused) || !errors.Is(err, delivery.ErrConnectionLost) {
			t.Errorf("%s: got %v, want an ambiguous error wrapping ErrConnectionLost", tc.name, err)
		}
		if i == 0 {
			if err := s.Send(ctx, testMessage(q, 1)); err != nil {
				t.Fatalf("send after the break: %v", err)
			}
		}
	}

	if err := s.Send(ctx, testMessage(q, 2)); err != nil {
		t.Fatalf("send after the second break: %v", err)
	}
	if p.count() != 3 {
		t.Errorf("%d connections, want a new one after each break", p.count())
	}
}

// TestOpenEndsWithItsContext: a broker that stops answering holds no Open past its
// context (the exchange check's calls take none), so it holds neither a worker's start
// nor its Close.
func TestOpenEndsWithItsContext(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ex := b.exchange("orders")
	p := newProxy(t)
	s := newSink(t, "orders", rabbitsink.Config{URL: p.url(), Exchange: ex})
	if err := s.Open(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	p.link(0).down.stall()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Open(ctx)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Open took %v, past its context of 500ms", took)
	}
	if _, ok := delivery.IsRetryable(err); !ok || delivery.IsPermanent(err) {
		t.Fatalf("got %v, want a retryable error (the broker may answer again)", err)
	}
	p.link(0).down.resume()
}

// sendBlocked starts sending d with an attempt of attempt, on a connection whose writes the
// proxy stalls, and returns once the write is under way (and blocks); the channel gets the
// send's error.
func sendBlocked(t *testing.T, s *rabbitsink.Sink, d delivery.Message, attempt time.Duration) <-chan error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attempt)
	t.Cleanup(cancel)
	errc := make(chan error, 1)
	go func() { errc <- s.Send(ctx, d) }()
	time.Sleep(300 * time.Millisecond)
	return errc
}
