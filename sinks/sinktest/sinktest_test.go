package sinktest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/sinktest"
)

// memDest is an in-memory downstream: what a memSink delivered to it.
type memDest struct {
	mu  sync.Mutex
	got []memCopy
}

type memCopy struct {
	id, key string
	attempt int
	payload []byte
}

func (d *memDest) take(m delivery.Message, key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, memCopy{id: m.MessageID, key: key, attempt: m.Attempt, payload: m.Payload})
}

func (d *memDest) received(_ *testing.T, id string) []sinktest.Received {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []sinktest.Received
	for _, c := range d.got {
		if c.id == id {
			out = append(out, sinktest.Received{Payload: c.payload, IdempotencyKey: c.key, Attempt: fmt.Sprint(c.attempt)})
		}
	}
	return out
}

// memSink is a handler over a memDest that behaves as a sink should, unless misbehave
// names one of the mistakes the suite must catch.
type memSink struct {
	dest      *memDest
	mode      string // ok, refuse, reject, stall, secret
	secret    string
	misbehave string
	cut       chan struct{} // stall: closed by Cut
	mu        sync.Mutex
	closed    bool
}

func (s *memSink) Open(context.Context) error {
	if s.mode == "secret" {
		return delivery.Permanent(errors.New("mem://server: credentials refused"))
	}
	return nil
}

func (s *memSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *memSink) Send(ctx context.Context, m delivery.Message) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return delivery.Retryable(errors.New("mem: the sink is closed"), 0)
	}
	key := m.MessageID
	if s.misbehave == "wrong-key" {
		key = fmt.Sprintf("%s-%d", m.MessageID, m.Attempt)
	}
	switch s.mode {
	case "refuse":
		failure := errors.New("mem: the server is full")
		if s.misbehave == "unmarked" {
			return failure
		}
		return delivery.Retryable(failure, time.Second)
	case "reject":
		return delivery.Permanent(errors.New("mem: no such queue"))
	case "stall":
		s.dest.take(m, key)
		select {
		case <-ctx.Done():
			if s.misbehave == "timeout-permanent" {
				return delivery.Permanent(ctx.Err())
			}
			return delivery.Ambiguous(fmt.Errorf("mem: no answer: %w", ctx.Err()))
		case <-s.cut:
			return delivery.Ambiguous(fmt.Errorf("mem: %w", delivery.ErrConnectionLost))
		}
	case "secret":
		if s.misbehave == "leak" {
			return delivery.Retryable(fmt.Errorf("mem://user:%s@server: credentials refused", s.secret), 0)
		}
		return delivery.Retryable(errors.New("mem://server: credentials refused"), 0)
	default:
		s.dest.take(m, key)
		return nil
	}
}

func (s *memSink) CheckProcessed(_ context.Context, m delivery.Message) (bool, error) {
	if s.mode == "secret" {
		return false, errors.New("mem://server: credentials refused")
	}
	return len(s.dest.received(nil, m.MessageID)) > 0, nil
}

// memHarness is the harness of memSink, misbehaving as misbehave says ("" for not at all).
func memHarness(misbehave string) sinktest.Harness {
	target := func(t *testing.T, mode string) (*memSink, sinktest.Target) {
		s := &memSink{dest: &memDest{}, mode: mode, misbehave: misbehave, cut: make(chan struct{})}
		t.Cleanup(func() { _ = s.Close() })
		return s, sinktest.Target{Handler: s, Received: s.dest.received}
	}
	h := sinktest.Harness{
		Name:           "mem",
		New:            func(t *testing.T) sinktest.Target { _, tg := target(t, "ok"); return tg },
		Refuse:         func(t *testing.T) sinktest.Target { _, tg := target(t, "refuse"); return tg },
		Reject:         func(t *testing.T) sinktest.Target { _, tg := target(t, "reject"); return tg },
		CarriesAttempt: true,
		Stall: func(t *testing.T) sinktest.Stalled {
			s, tg := target(t, "stall")
			var once sync.Once
			return sinktest.Stalled{Target: tg, Cut: func() {
				time.Sleep(50 * time.Millisecond) // the write goes out first
				once.Do(func() { close(s.cut) })
			}}
		},
		WithSecret: func(t *testing.T, secret string) []delivery.Handler {
			s, _ := target(t, "secret")
			s.secret = secret
			return []delivery.Handler{s}
		},
		BadConfig: func(secret string) []error {
			return []error{errors.New("url: must be mem://host, got \"http://server\"")}
		},
		StallTimeout: 300 * time.Millisecond,
		SendTimeout:  5 * time.Second,
	}
	switch misbehave {
	case "missing-refuse":
		h.Refuse = nil
	case "unsupported-without-reason":
		h.Unsupported = map[sinktest.Case]string{sinktest.Retryable: " "}
	case "unsupported-accepted":
		h.Unsupported = map[sinktest.Case]string{sinktest.Accepted: "cannot"}
	}
	return h
}

var (
	_ delivery.Opener  = (*memSink)(nil)
	_ delivery.Checker = (*memSink)(nil)
	_ io.Closer        = (*memSink)(nil)
)

func TestACorrectHandlerPasses(t *testing.T) {
	sinktest.Run(t, memHarness(""))
}

func TestAnUnsupportedCaseIsSkippedWithItsReason(t *testing.T) {
	h := memHarness("")
	h.Refuse = nil
	h.Unsupported = map[sinktest.Case]string{sinktest.Retryable: "the memory server is never full"}
	sinktest.Run(t, h)
}

// misbehaveEnv names the mistake TestHelperMisbehaving runs the suite with.
const misbehaveEnv = "SINKTEST_MISBEHAVE"

// TestHelperMisbehaving runs the suite against a handler that misbehaves, in the child
// process of TestTheSuiteCatchesMistakes.
func TestHelperMisbehaving(t *testing.T) {
	misbehave := os.Getenv(misbehaveEnv)
	if misbehave == "" {
		t.Skip("the child process of TestTheSuiteCatchesMistakes")
	}
	sinktest.Run(t, memHarness(misbehave))
}

func TestTheSuiteCatchesMistakes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		misbehave string
		fail      []string // the subtests that must fail (under TestHelperMisbehaving/mem)
		want      string   // in the output
	}{
		{"unmarked", []string{"Retryable"}, "want one marked delivery.Retryable"},
		{"leak", []string{"SecretsNeverInErrors"}, "the error shows the secret"},
		{"timeout-permanent", []string{"AmbiguousTimeout"}, "want an ambiguous one"},
		{"wrong-key", []string{"Accepted", "AmbiguousTimeout", "AmbiguousBrokenConnection", "IdempotencyKey"}, "want the message ID"},
		{"missing-refuse", nil, "Harness.Refuse is not set, which case Retryable needs"},
		{"unsupported-without-reason", nil, "Unsupported names Retryable without a reason"},
		{"unsupported-accepted", nil, "Unsupported names Accepted, which every sink must pass"},
	} {
		t.Run(tc.misbehave, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMisbehaving$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), misbehaveEnv+"="+tc.misbehave)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed a handler that misbehaves (%s), or did not run: %v\n%s", tc.misbehave, err, out)
			}
			text := string(out)
			if !strings.Contains(text, tc.want) {
				t.Errorf("output does not say %q:\n%s", tc.want, text)
			}
			for _, c := range sinktest.Cases {
				failed := strings.Contains(text, "--- FAIL: TestHelperMisbehaving/mem/"+string(c)+" ")
				if want := contains(tc.fail, string(c)); failed != want && tc.fail != nil {
					t.Errorf("case %s failed: %v, want %v\n%s", c, failed, want, text)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestProxyHoldsAnswersAndCutsAfterTheWrite: through the proxy, a write reaches the
// server while the answer is held, and Cut breaks the connection after it.
func TestProxyHoldsAnswersAndCutsAfterTheWrite(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 4)
	go func() { // an echo server that reports what it read
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					got <- string(buf[:n])
					_, _ = c.Write(buf[:n])
				}
			}()
		}
	}()
	p := sinktest.NewProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("echo before Hold: %q, %v", buf[:n], err)
	}
	<-got

	p.Hold()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "held" {
			t.Fatalf("the server read %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the write did not reach the server")
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("the answer came through while held: %q", buf[:n])
	}
	_ = c.SetReadDeadline(time.Time{})
	p.Cut()
	if _, err := c.Read(buf); err == nil {
		t.Fatal("the connection still works after Cut")
	}
	if p.Conns() != 1 {
		t.Errorf("%d connections, want 1", p.Conns())
	}
}
