package sinktest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on the loopback between a sink and its real server, for the
// faults of the ambiguous cases: Hold lets what the sink sends through to the server but
// holds back what the server answers, on the connections open then, and Cut breaks them
// once the sink's write has gone through. Connections made after Hold are carried
// normally.
type Proxy struct {
	t        testing.TB
	ln       net.Listener
	upstream string

	mu        sync.Mutex
	links     []*link
	closed    bool
	wrote     chan struct{} // closed by the first bytes a held connection forwards
	lastWrite time.Time     // of a held connection
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	held           chan struct{} // closed by Hold
	holdOnce       sync.Once
	done           chan struct{} // closed when the link is cut
	cutOnce        sync.Once
}

// NewProxy starts a proxy to upstream (host:port), closed when the test ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sinktest: proxy: %v", err)
	}
	p := &Proxy{t: t, ln: ln, upstream: upstream, wrote: make(chan struct{})}
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address (127.0.0.1:port), to give the sink instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Conns returns the number of connections the proxy has accepted.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Hold stops forwarding what the server sends on the connections open now: the sink's
// next write reaches the server, and its answer never comes back.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wrote, p.lastWrite = make(chan struct{}), time.Time{}
	for _, l := range p.links {
		l.holdOnce.Do(func() { close(l.held) })
	}
}

// Written is closed when a write on a connection held by the last Hold has gone through
// to the server: for a sink whose connections go through several proxies (one per broker),
// to find the one to Cut.
func (p *Proxy) Written() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wrote
}

// quiet is how long the held connections must send nothing before Cut breaks them: the
// rest of a write that came in several reads goes through first.
const quiet = 200 * time.Millisecond

// Cut waits until a write on a held connection has gone through to the server (failing the
// test after 10s without one), then breaks every connection open, both sides, as a lost
// network or a crashed server would. It returns when they are closed.
func (p *Proxy) Cut() {
	p.t.Helper()
	p.mu.Lock()
	wrote := p.wrote
	p.mu.Unlock()
	select {
	case <-wrote:
	case <-time.After(10 * time.Second):
		p.t.Errorf("sinktest: proxy: no write reached the server within 10s of Hold")
	}
	for {
		p.mu.Lock()
		since := time.Since(p.lastWrite)
		p.mu.Unlock()
		if since >= quiet {
			break
		}
		time.Sleep(quiet - since)
	}
	p.cutAll()
}

// Close stops the proxy and breaks its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.cutAll()
}

func (p *Proxy) cutAll() {
	p.mu.Lock()
	links := append([]*link(nil), p.links...)
	p.mu.Unlock()
	for _, l := range links {
		l.cut()
	}
}

func (p *Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		l := &link{client: client, server: server, held: make(chan struct{}), done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.cut()
			return
		}
		p.links = append(p.links, l)
		p.mu.Unlock()
		go p.up(l)
		go p.down(l)
	}
}

// up forwards what the sink sends, noting a write on a held connection.
func (p *Proxy) up(l *link) {
	defer l.cut()
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			if _, werr := l.server.Write(buf[:n]); werr != nil {
				return
			}
			if l.isHeld() {
				p.noteWrite()
			}
		}
		if err != nil {
			return
		}
	}
}

// down forwards what the server sends, until the connection is held.
func (p *Proxy) down(l *link) {
	defer l.cut()
	buf := make([]byte, 32<<10)
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
			if l.isHeld() {
				<-l.done // dropped: the link is cut before it is released
				return
			}
			if _, werr := l.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) noteWrite() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastWrite = time.Now()
	select {
	case <-p.wrote:
	default:
		close(p.wrote)
	}
}

func (l *link) isHeld() bool {
	select {
	case <-l.held:
		return true
	default:
		return false
	}
}

func (l *link) cut() {
	l.cutOnce.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}
