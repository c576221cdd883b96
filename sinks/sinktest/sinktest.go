// Package sinktest is the conformance suite every sink passes against its real server:
// the outbox's own (http, nats, rabbitmq, kafka) and any a team adds. [Run] sends
// messages through the sink and provokes each condition with the real server, then
// checks what the sink said and what the server got:
//
//   - Accepted: Send returns nil, the destination holds the message once, with its
//     payload and with the message ID as its idempotency key; sending it again is safe.
//   - Retryable: a server that turns the message away without taking it is reported
//     with [delivery.Retryable].
//   - Permanent: what no retry can fix (a 4xx, a subject no stream captures, a missing
//     exchange or topic) is reported with [delivery.Permanent].
//   - AmbiguousTimeout and AmbiguousBrokenConnection: a write that reached the server
//     with no answer before the attempt's deadline, or whose connection broke after it,
//     is ambiguous ([delivery.IsAmbiguous]), never permanent or retryable.
//   - IdempotencyKey: every attempt of a message carries its ID as the idempotency key
//     (and its attempt number, where the sink carries one).
//   - SecretsNeverInErrors: a password, API key or token in the sink's settings appears
//     in no error of New, Open, Send, CheckProcessed or Close.
//   - Checker, Opener, Closer: for a handler that implements them, CheckProcessed tells a
//     sent message from one never sent (or answers [delivery.ErrCheckUnsupported]), Open
//     succeeds against the live server, and Close returns.
//
// A sink's test fills a [Harness] with functions that build the sink against a fresh
// destination of the test's own (a queue, a stream, a topic, a test server) and provoke
// each condition; [Proxy] is a TCP proxy between the sink and its server for the stalled
// and broken connections. A condition the sink cannot produce is declared in
// Harness.Unsupported with the reason, and reported as skipped with it; it is never left
// out silently.
//
// A team that adds a sink runs the suite on its own:
//
//	func TestConformance(t *testing.T) {
//		sinktest.Run(t, sinktest.Harness{
//			Name: "acme",
//			New: func(t *testing.T) sinktest.Target {
//				queue := createQueue(t) // on the real server, deleted by t.Cleanup
//				return sinktest.Target{
//					Handler:  newSink(t, acmesink.Config{URL: serverURL, Queue: queue}),
//					Received: func(t *testing.T, id string) []sinktest.Received { return readQueue(t, queue, id) },
//				}
//			},
//			Refuse: func(t *testing.T) sinktest.Target { ... }, // a full queue: retryable
//			Reject: func(t *testing.T) sinktest.Target { ... }, // a queue that does not exist: permanent
//			Stall: func(t *testing.T) sinktest.Stalled {
//				p := sinktest.NewProxy(t, serverAddr)
//				s := newSink(t, acmesink.Config{URL: "acme://" + p.Addr(), Queue: createQueue(t)})
//				// Open it, then hold what the server answers.
//				p.Hold()
//				return sinktest.Stalled{Target: sinktest.Target{Handler: s}, Cut: p.Cut}
//			},
//			WithSecret: func(t *testing.T, secret string) []delivery.Handler { ... },
//			BadConfig:  func(secret string) []error { ... },
//			Unsupported: map[sinktest.Case]string{
//				sinktest.Retryable: "the server never says it did not take a message",
//			},
//		})
//	}
//
// Run's cases run in parallel, so the harness's functions are called concurrently, each
// with its case's t. Run needs no broker client and no Temporal server: it depends on
// package delivery and the standard library.
package sinktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-go/outbox/delivery"
)

// Case names a condition of the suite, and its subtest.
type Case string

// The cases Run checks, in the order it starts them.
const (
	Accepted                  Case = "Accepted"
	Retryable                 Case = "Retryable"
	Permanent                 Case = "Permanent"
	AmbiguousTimeout          Case = "AmbiguousTimeout"
	AmbiguousBrokenConnection Case = "AmbiguousBrokenConnection"
	IdempotencyKey            Case = "IdempotencyKey"
	SecretsNeverInErrors      Case = "SecretsNeverInErrors"
	Checker                   Case = "Checker"
	Opener                    Case = "Opener"
	Closer                    Case = "Closer"
)

// Cases lists every case, in the order Run starts them.
var Cases = []Case{Accepted, Retryable, Permanent, AmbiguousTimeout, AmbiguousBrokenConnection,
	IdempotencyKey, SecretsNeverInErrors, Checker, Opener, Closer}

// required are the cases no sink may declare unsupported.
var required = []Case{Accepted, IdempotencyKey}

// Received is one copy of a message as the real server got it.
type Received struct {
	// Payload is the message's payload as the destination holds it (for a sink that
	// wraps it, such as the http sink's JSON envelope, the payload inside).
	Payload []byte
	// IdempotencyKey is the key the destination de-duplicates by, as the copy carries it:
	// the http sink's Idempotency-Key header, NATS's Nats-Msg-Id, RabbitMQ's message_id,
	// the Kafka record's Outbox-Message-Id header. A harness whose sink carries the key in
	// several places reports them all when they disagree, so the check fails.
	IdempotencyKey string
	// Attempt is the attempt number the copy carries (Outbox-Attempt), or "" for a sink
	// that does not carry one.
	Attempt string
	// Headers are the copy's headers, for the log of a failure.
	Headers map[string]string
}

// Target is a sink the harness built against a destination of its own on the real server.
type Target struct {
	// Handler is the sink. Run closes it only in the Closer case: the harness closes it
	// (t.Cleanup), as it removes the destination.
	Handler delivery.Handler
	// Received returns every copy of the message messageID that the destination holds
	// now, in the order it got them. Required for New and Stall; for Refuse and Reject,
	// where it may be nil, Run checks the destination took nothing.
	Received func(t *testing.T, messageID string) []Received
}

// Stalled is a sink whose next write reaches the real server (or the fault proxy in front
// of it) but gets no answer: the harness has opened the sink (Run does not call its Open)
// and then held what the server sends back, with Proxy.Hold for example.
type Stalled struct {
	Target
	// Cut breaks the connection the stalled write went over, once the write reached the
	// server: it waits for the write, then breaks the connection (Proxy.Cut).
	Cut func()
}

// Harness is what a sink's test gives Run: functions that build the sink against the real
// server and provoke each condition there. Each function builds what it needs for the
// case of its t, and removes it with t.Cleanup.
type Harness struct {
	// Name names the sink, as the subtest that holds the cases. Defaults to "sink".
	Name string
	// Topic is the topic of the messages Run sends. Defaults to "sinktest.order.created".
	Topic string

	// New builds the sink against a fresh destination on the real server. Required.
	New func(t *testing.T) Target
	// Refuse builds a sink whose server turns the message away without taking it (a
	// full stream, a server answering 503, a broker refusing the connection): its Send
	// must be retryable.
	Refuse func(t *testing.T) Target
	// Reject builds a sink whose server refuses the message for good (a 4xx, a subject
	// no stream captures, an exchange or a topic that does not exist): its Send must be
	// permanent.
	Reject func(t *testing.T) Target
	// Stall builds a sink whose next write reaches the server but gets no answer; it is
	// called once for AmbiguousTimeout, once for AmbiguousBrokenConnection.
	Stall func(t *testing.T) Stalled
	// WithSecret builds sinks configured with secret in each place the sink takes one (a
	// password or token in the URL, the password setting, a header), each pointed where
	// its sends fail: a server that refuses the credentials, an address nothing listens
	// on, a destination that does not exist.
	WithSecret func(t *testing.T, secret string) []delivery.Handler
	// BadConfig returns the errors of the sink's constructor for settings it refuses, each
	// carrying secret (in a URL, a password setting ...).
	BadConfig func(secret string) []error
	// CarriesAttempt says the destination sees the attempt number (Received.Attempt).
	CarriesAttempt bool

	// Unsupported declares the cases the sink cannot produce, each with the reason; Run
	// reports them as skipped with it. Accepted and IdempotencyKey cannot be declared.
	Unsupported map[Case]string

	// SendTimeout bounds each Send, Open, CheckProcessed and Close that should end on its
	// own. Defaults to 15s.
	SendTimeout time.Duration
	// StallTimeout is the deadline of the send in AmbiguousTimeout, and of the sends of
	// SecretsNeverInErrors. Defaults to 2s.
	StallTimeout time.Duration
}

// grace is how long after its context's deadline a call may take to return.
const grace = 5 * time.Second

// Run runs the suite against the sink h describes, as subtests of one named h.Name; it
// returns when they are done. See the package documentation.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Name == "" {
		h.Name = "sink"
	}
	if h.Topic == "" {
		h.Topic = "sinktest.order.created"
	}
	if h.SendTimeout <= 0 {
		h.SendTimeout = 15 * time.Second
	}
	if h.StallTimeout <= 0 {
		h.StallTimeout = 2 * time.Second
	}
	t.Run(h.Name, func(t *testing.T) {
		if !h.valid(t) {
			return
		}
		for _, c := range Cases {
			t.Run(string(c), func(t *testing.T) {
				t.Parallel()
				if reason, ok := h.Unsupported[c]; ok {
					t.Skipf("declared unsupported by the %s sink's harness: %s", h.Name, reason)
				}
				run := map[Case]func(*testing.T, Harness){
					Accepted: runAccepted, Retryable: runRetryable, Permanent: runPermanent,
					AmbiguousTimeout: runTimeout, AmbiguousBrokenConnection: runBroken,
					IdempotencyKey: runIdempotencyKey, SecretsNeverInErrors: runSecrets,
					Checker: runChecker, Opener: runOpener, Closer: runCloser,
				}[c]
				run(t, h)
			})
		}
	})
}

// valid reports the harness's mistakes: a case neither provided for nor declared
// unsupported, a declaration without a reason.
func (h Harness) valid(t *testing.T) bool {
	t.Helper()
	ok := true
	fail := func(format string, args ...any) {
		t.Errorf("sinktest: "+format, args...)
		ok = false
	}
	for c, reason := range h.Unsupported {
		switch {
		case !slices.Contains(Cases, c):
			fail("Unsupported names %q, which is not a case: the cases are %v", c, Cases)
		case slices.Contains(required, c):
			fail("Unsupported names %s, which every sink must pass", c)
		case strings.TrimSpace(reason) == "":
			fail("Unsupported names %s without a reason: say why the sink cannot produce it", c)
		}
	}
	for _, need := range []struct {
		set   bool
		field string
		cases []Case
	}{
		{h.New != nil, "New", []Case{Accepted, IdempotencyKey, Checker, Opener, Closer}},
		{h.Refuse != nil, "Refuse", []Case{Retryable}},
		{h.Reject != nil, "Reject", []Case{Permanent}},
		{h.Stall != nil, "Stall", []Case{AmbiguousTimeout, AmbiguousBrokenConnection}},
		{h.WithSecret != nil && h.BadConfig != nil, "WithSecret and BadConfig", []Case{SecretsNeverInErrors}},
	} {
		if need.set {
			continue
		}
		for _, c := range need.cases {
			if _, declared := h.Unsupported[c]; !declared {
				fail("Harness.%s is not set, which case %s needs: set it, or declare the case in Unsupported with the reason", need.field, c)
			}
		}
	}
	return ok
}

// NewMessageID returns a random UUID (version 4), as the outbox's message IDs are UUIDs.
func NewMessageID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b[:])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

// message returns a message of its own for the case of t.
func (h Harness) message(t *testing.T) delivery.Message {
	id := NewMessageID()
	payload, _ := json.Marshal(map[string]string{"sinktest": t.Name(), "message_id": id})
	return delivery.Message{
		MessageID: id, Topic: h.Topic, Payload: payload,
		Headers: map[string]string{"Sinktest-Case": "1"},
		Attempt: 1, MaxAttempts: 5,
		// Whole seconds: AMQP timestamps have no fraction.
		CreatedAt: time.Now().UTC().Truncate(time.Second),
	}
}

// call runs f with a context of timeout, and fails t when f does not return within
// grace after the deadline: a sink must honour its context.
func call(t *testing.T, what string, timeout time.Duration, f func(ctx context.Context) error) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return await(t, what, timeout, func() error { return f(ctx) })
}

// await waits for f, for at most timeout and grace.
func await(t *testing.T, what string, timeout time.Duration, f func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(timeout + grace):
		t.Fatalf("%s did not return within %v of its context's deadline (%v): a sink must return when its context ends", what, grace, timeout)
		return 0, nil
	}
}

func send(t *testing.T, hd delivery.Handler, m delivery.Message, timeout time.Duration) (time.Duration, error) {
	t.Helper()
	return call(t, fmt.Sprintf("Send (attempt %d)", m.Attempt), timeout, func(ctx context.Context) error { return hd.Send(ctx, m) })
}

// open calls Open on a handler that is an Opener, as the worker does before the first
// message, and fails t on an error when must is set.
func open(t *testing.T, h Harness, hd delivery.Handler, must bool) error {
	t.Helper()
	o, ok := hd.(delivery.Opener)
	if !ok {
		return nil
	}
	_, err := call(t, "Open", h.SendTimeout, o.Open)
	if err != nil && must {
		t.Fatalf("Open against the live server: %v", err)
	}
	return err
}

// describe names an error's kind for a failure message.
func describe(err error) string {
	if err == nil {
		return "nil"
	}
	kind := delivery.KindOf(err).String()
	var marked *delivery.Error
	if !errors.As(err, &marked) {
		kind = "unmarked (so ambiguous)"
	}
	return fmt.Sprintf("%s error %q", kind, err)
}

// received returns what tg's destination holds for m, and fails t unless every copy
// carries m's ID as its idempotency key and m's payload.
func received(t *testing.T, tg Target, m delivery.Message) []Received {
	t.Helper()
	if tg.Received == nil {
		t.Fatalf("sinktest: Target.Received is not set: the case needs what the destination got")
	}
	copies := tg.Received(t, m.MessageID)
	for i, c := range copies {
		if c.IdempotencyKey != m.MessageID {
			t.Errorf("copy %d of message %s carries idempotency key %q, want the message ID (headers %v)", i+1, m.MessageID, c.IdempotencyKey, c.Headers)
		}
		if !samePayload(c.Payload, m.Payload) {
			t.Errorf("copy %d of message %s has payload %s, want %s", i+1, m.MessageID, c.Payload, m.Payload)
		}
	}
	return copies
}

// samePayload compares JSON by value, anything else byte for byte.
func samePayload(got, want []byte) bool {
	if bytes.Equal(got, want) {
		return true
	}
	var g, w any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(want, &w) != nil {
		return false
	}
	gj, _ := json.Marshal(g)
	wj, _ := json.Marshal(w)
	return bytes.Equal(gj, wj)
}

// nothingTaken fails t when tg's destination holds m, after a failure that says it did
// not take it.
func nothingTaken(t *testing.T, tg Target, m delivery.Message) {
	t.Helper()
	if tg.Received == nil {
		return
	}
	if copies := tg.Received(t, m.MessageID); len(copies) > 0 {
		t.Errorf("the destination holds %d copies of message %s, though the send's failure says it took nothing", len(copies), m.MessageID)
	}
}

func runAccepted(t *testing.T, h Harness) {
	tg := h.New(t)
	open(t, h, tg.Handler, true)
	m := h.message(t)
	if _, err := send(t, tg.Handler, m, h.SendTimeout); err != nil {
		t.Fatalf("Send to the live server: %s", describe(err))
	}
	if copies := received(t, tg, m); len(copies) != 1 {
		t.Fatalf("after one Send that returned nil the destination holds %d copies of the message, want 1", len(copies))
	}
	m.Attempt = 2
	if _, err := send(t, tg.Handler, m, h.SendTimeout); err != nil {
		t.Fatalf("Send of the same message again (a resend must be safe): %s", describe(err))
	}
	switch copies := received(t, tg, m); len(copies) {
	case 1:
		t.Logf("the destination absorbed the resend: it holds the message once")
	case 2:
		t.Logf("the destination holds the message twice, both with its ID as idempotency key: its consumers de-duplicate by it")
	default:
		t.Errorf("after two Sends of the message the destination holds %d copies, want 1 or 2", len(copies))
	}
}

func runRetryable(t *testing.T, h Harness) {
	tg := h.Refuse(t)
	if err := open(t, h, tg.Handler, false); err != nil {
		t.Logf("Open: %s", describe(err))
	}
	m := h.message(t)
	_, err := send(t, tg.Handler, m, h.SendTimeout)
	if err == nil {
		t.Fatal("Send to a server that turns the message away returned nil")
	}
	wait, ok := delivery.IsRetryable(err)
	if !ok {
		t.Fatalf("Send to a server that turns the message away without taking it: got a %s, want one marked delivery.Retryable", describe(err))
	}
	t.Logf("retryable (retry after %v): %v", wait, err)
	nothingTaken(t, tg, m)
}

func runPermanent(t *testing.T, h Harness) {
	tg := h.Reject(t)
	if err := open(t, h, tg.Handler, false); err != nil {
		t.Logf("Open: %s", describe(err))
	}
	m := h.message(t)
	_, err := send(t, tg.Handler, m, h.SendTimeout)
	if err == nil {
		t.Fatal("Send to a server that refuses the message for good returned nil")
	}
	if !delivery.IsPermanent(err) {
		t.Fatalf("Send that no retry can fix: got a %s, want one marked delivery.Permanent", describe(err))
	}
	t.Logf("permanent: %v", err)
	nothingTaken(t, tg, m)
}

// ambiguous fails t unless err is ambiguous.
func ambiguous(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !delivery.IsAmbiguous(err) {
		t.Fatalf("%s: got a %s, want an ambiguous one (delivery.Ambiguous, or unmarked): the server may have the message", what, describe(err))
	}
}

func runTimeout(t *testing.T, h Harness) {
	st := h.Stall(t)
	m := h.message(t)
	took, err := send(t, st.Handler, m, h.StallTimeout)
	ambiguous(t, fmt.Sprintf("Send whose write got no answer within its deadline of %v", h.StallTimeout), err)
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	copies := received(t, st.Target, m)
	t.Logf("the server holds %d copies of the message whose send timed out", len(copies))
}

func runBroken(t *testing.T, h Harness) {
	st := h.Stall(t)
	if st.Cut == nil {
		t.Fatal("sinktest: Stalled.Cut is not set")
	}
	m := h.message(t)
	ctx, cancel := context.WithTimeout(context.Background(), h.SendTimeout)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- st.Handler.Send(ctx, m) }()
	st.Cut()
	_, err := await(t, "Send on a connection broken after its write", h.SendTimeout, func() error { return <-done })
	took := time.Since(start).Round(time.Millisecond)
	copies := received(t, st.Target, m)
	if err == nil {
		// The sink resolved the doubt itself (an idempotent producer resending on a new
		// connection): nil is right when the server has the message.
		if len(copies) == 0 {
			t.Fatalf("Send on a connection broken after its write returned nil, but the server does not hold the message")
		}
		t.Logf("the sink recovered the broken send by itself after %v: the server holds the message %d times", took, len(copies))
		return
	}
	ambiguous(t, "Send on a connection broken after its write", err)
	t.Logf("after %v (deadline %v): %v", took, h.SendTimeout, err)
	if !errors.Is(err, delivery.ErrConnectionLost) {
		t.Logf("note: the error does not wrap delivery.ErrConnectionLost, so outbox_send_connection_lost_total does not count it")
	}
	if ctx.Err() != nil {
		t.Logf("note: the sink reported the broken connection only when the attempt's deadline came")
	}
	t.Logf("the server holds %d copies of the message", len(copies))
}

func runIdempotencyKey(t *testing.T, h Harness) {
	tg := h.New(t)
	open(t, h, tg.Handler, true)
	m := h.message(t)
	const attempts = 3
	for a := 1; a <= attempts; a++ {
		m.Attempt = a
		if _, err := send(t, tg.Handler, m, h.SendTimeout); err != nil {
			t.Fatalf("attempt %d: %s", a, describe(err))
		}
	}
	copies := received(t, tg, m)
	if len(copies) < 1 || len(copies) > attempts {
		t.Fatalf("after %d attempts the destination holds %d copies, want 1 to %d", attempts, len(copies), attempts)
	}
	last := 0
	for i, c := range copies {
		if c.Attempt == "" {
			if h.CarriesAttempt {
				t.Errorf("copy %d carries no attempt number, though the harness says the sink carries it (headers %v)", i+1, c.Headers)
			}
			continue
		}
		n, err := strconv.Atoi(c.Attempt)
		if err != nil || n <= last || n > attempts || (i == 0 && n != 1) {
			t.Errorf("copy %d carries attempt %q; the destination got attempts %v in order", i+1, c.Attempt, attemptsOf(copies))
		}
		last = n
	}
	t.Logf("%d attempts, %d copies in the destination, attempts carried: %v", attempts, len(copies), attemptsOf(copies))
}

func attemptsOf(copies []Received) []string {
	out := make([]string, len(copies))
	for i, c := range copies {
		out[i] = c.Attempt
	}
	return out
}

// NewSecret returns a secret for SecretsNeverInErrors: letters and digits only, so URL
// escaping leaves it as it is.
func NewSecret() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "Sinktest" + hex.EncodeToString(b[:]) + "Secret"
}

// leaks fails t when err's text shows secret, in any case.
func leaks(t *testing.T, what string, err error, secret string) {
	t.Helper()
	if err == nil {
		return
	}
	for _, text := range []string{err.Error(), fmt.Sprintf("%+v", err)} {
		if strings.Contains(strings.ToLower(text), strings.ToLower(secret)) {
			t.Errorf("%s: the error shows the secret: %s", what, text)
			return
		}
	}
	t.Logf("%s: %v", what, err)
}

func runSecrets(t *testing.T, h Harness) {
	secret := NewSecret()
	errs := h.BadConfig(secret)
	if len(errs) == 0 {
		t.Error("sinktest: BadConfig returned no error")
	}
	for i, err := range errs {
		if err == nil {
			t.Errorf("BadConfig[%d]: the constructor accepted the settings", i)
			continue
		}
		leaks(t, fmt.Sprintf("New with bad settings [%d]", i), err, secret)
	}
	handlers := h.WithSecret(t, secret)
	if len(handlers) == 0 {
		t.Fatal("sinktest: WithSecret returned no handler")
	}
	for i, hd := range handlers {
		if o, ok := hd.(delivery.Opener); ok {
			_, err := call(t, "Open", h.StallTimeout, o.Open)
			leaks(t, fmt.Sprintf("handler %d: Open", i), err, secret)
		}
		m := h.message(t)
		_, err := send(t, hd, m, h.StallTimeout)
		if err == nil {
			t.Errorf("handler %d: Send succeeded: WithSecret must point the sink where its sends fail", i)
		}
		leaks(t, fmt.Sprintf("handler %d: Send", i), err, secret)
		if c, ok := hd.(delivery.Checker); ok {
			check := m
			check.Attempt, check.MaxAttempts = 0, 0
			_, err := call(t, "CheckProcessed", h.StallTimeout, func(ctx context.Context) error {
				_, err := c.CheckProcessed(ctx, check)
				return err
			})
			leaks(t, fmt.Sprintf("handler %d: CheckProcessed", i), err, secret)
		}
		if c, ok := hd.(io.Closer); ok {
			_, err := await(t, "Close", h.SendTimeout, c.Close)
			leaks(t, fmt.Sprintf("handler %d: Close", i), err, secret)
		}
	}
}

func runChecker(t *testing.T, h Harness) {
	tg := h.New(t)
	c, ok := tg.Handler.(delivery.Checker)
	if !ok {
		t.Skipf("the %s sink's handler (%T) does not implement delivery.Checker: a message whose send was ambiguous is sent again", h.Name, tg.Handler)
	}
	open(t, h, tg.Handler, true)
	m := h.message(t)
	check := func() (bool, error) {
		t.Helper()
		q := m
		q.Attempt, q.MaxAttempts = 0, 0 // as the delivery workflow asks
		var processed bool
		_, err := call(t, "CheckProcessed", h.SendTimeout, func(ctx context.Context) error {
			var err error
			processed, err = c.CheckProcessed(ctx, q)
			return err
		})
		return processed, err
	}
	processed, err := check()
	if errors.Is(err, delivery.ErrCheckUnsupported) {
		t.Logf("CheckProcessed answers ErrCheckUnsupported for this destination")
		return
	}
	if err != nil || processed {
		t.Fatalf("CheckProcessed of a message never sent: got (%v, %v), want (false, nil)", processed, err)
	}
	if _, err := send(t, tg.Handler, m, h.SendTimeout); err != nil {
		t.Fatalf("Send: %s", describe(err))
	}
	if processed, err = check(); err != nil || !processed {
		t.Fatalf("CheckProcessed of a message sent: got (%v, %v), want (true, nil)", processed, err)
	}
}

func runOpener(t *testing.T, h Harness) {
	tg := h.New(t)
	if _, ok := tg.Handler.(delivery.Opener); !ok {
		t.Skipf("the %s sink's handler (%T) does not implement delivery.Opener: it connects on its first send", h.Name, tg.Handler)
	}
	open(t, h, tg.Handler, true)
	if err := open(t, h, tg.Handler, false); err != nil {
		t.Fatalf("Open a second time: %v", err)
	}
	m := h.message(t)
	if _, err := send(t, tg.Handler, m, h.SendTimeout); err != nil {
		t.Fatalf("Send after Open: %s", describe(err))
	}
}

func runCloser(t *testing.T, h Harness) {
	tg := h.New(t)
	c, ok := tg.Handler.(io.Closer)
	if !ok {
		t.Skipf("the %s sink's handler (%T) does not implement io.Closer: it holds nothing to release", h.Name, tg.Handler)
	}
	open(t, h, tg.Handler, true)
	m := h.message(t)
	if _, err := send(t, tg.Handler, m, h.SendTimeout); err != nil {
		t.Fatalf("Send: %s", describe(err))
	}
	if took, err := await(t, "Close", h.SendTimeout, c.Close); err != nil {
		t.Fatalf("Close after %v: %v", took, err)
	}
}
