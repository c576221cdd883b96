package delivery

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Handler delivers the messages of a topic.
type Handler interface {
	// Send delivers m and returns nil when the downstream has it. It must be safe to
	// call again with the same message: m.MessageID is the idempotency key the
	// downstream de-duplicates by.
	Send(ctx context.Context, m Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, m Message) error

// Send calls f.
func (f HandlerFunc) Send(ctx context.Context, m Message) error { return f(ctx, m) }

// Checker is implemented by handlers that can ask the downstream whether it already
// processed a message. It returns ErrCheckUnsupported when it cannot tell.
type Checker interface {
	CheckProcessed(ctx context.Context, m Message) (processed bool, err error)
}

// ErrCheckUnsupported is returned by a Checker that cannot answer for a message.
var ErrCheckUnsupported = errors.New("check-processed is not supported")

// Opener is implemented by handlers that connect before the first message: Open is called
// when the worker starts. An error marked Permanent (a bad address, refused credentials, a
// missing stream, exchange or topic: what no retry fixes) stops the start. Any other (a
// broker that cannot be reached now) does not: the worker starts, reports the sink not
// ready, and calls Open again in the background until it succeeds, while the topic's
// sends fail and are retried as in any outage. Open must be safe to call again after it
// failed. A handler that holds a connection may also implement io.Closer, called when the
// worker stops.
type Opener interface {
	Open(ctx context.Context) error
}

// Kind is what a handler's failure means for the message.
type Kind int

// The kinds of failure.
const (
	// KindAmbiguous: the downstream may have the message; it is checked before it is
	// sent again. An error not marked is ambiguous.
	KindAmbiguous Kind = iota
	// KindRetryable: the downstream reported it did not take the message.
	KindRetryable
	// KindPermanent: no retry can deliver the message; it is dead-lettered.
	KindPermanent
)

// The types of the Temporal ApplicationErrors a failed attempt is reported with, by its
// Kind: what the delivery workflow reads (see teamactivity.ApplicationError).
const (
	ErrTypePermanent = "OutboxPermanent"
	ErrTypeRetryable = "OutboxRetryable"
	ErrTypeAmbiguous = "OutboxAmbiguous"
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case KindRetryable:
		return "retryable"
	case KindPermanent:
		return "permanent"
	default:
		return "ambiguous"
	}
}

// Error is a handler's failure with its kind and the least wait before the next attempt.
// Build it with Permanent, Retryable, Ambiguous or RetryAfter. Err may be nil (a handler
// that marks a failure without a cause of its own): the message's last error is then the
// kind alone, "permanent failure" say.
type Error struct {
	Err        error
	Kind       Kind
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Kind.String() + " failure"
	}
	return e.Err.Error()
}
func (e *Error) Unwrap() error { return e.Err }

// Permanent marks err as a failure no retry can fix: the message is dead-lettered
// without further attempts.
func Permanent(err error) error { return &Error{Err: err, Kind: KindPermanent} }

// Retryable marks err as a failure the downstream reported without processing the
// message; the next attempt waits at least retryAfter when it is positive.
func Retryable(err error, retryAfter time.Duration) error {
	return &Error{Err: err, Kind: KindRetryable, RetryAfter: retryAfter}
}

// Ambiguous marks err as a failure after which the downstream may have the message; the
// topic's check is asked before the message is sent again.
func Ambiguous(err error) error { return &Error{Err: err, Kind: KindAmbiguous} }

// RetryAfter returns err with the least wait before the next attempt set to d, keeping
// the kind err was marked with (an unmarked err is ambiguous).
func RetryAfter(err error, d time.Duration) error {
	return &Error{Err: err, Kind: KindOf(err), RetryAfter: d}
}

// ErrConnectionLost marks a send that failed because the connection it was written on
// broke, not because of the message: a handler wraps it (fmt.Errorf("...: %w",
// ErrConnectionLost)) inside an Ambiguous or Retryable error, and the send activity counts
// it (outbox_send_connection_lost_total) besides the attempt's failure.
var ErrConnectionLost = errors.New("connection lost")

// KindOf returns the kind err, or an error it wraps, was marked with; an error not
// marked is ambiguous.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindAmbiguous
}

// IsPermanent reports whether err, or an error it wraps, was marked with Permanent.
func IsPermanent(err error) bool { return err != nil && KindOf(err) == KindPermanent }

// IsRetryable reports whether err, or an error it wraps, was marked with Retryable, and
// the least wait it asked for before the next attempt.
func IsRetryable(err error) (retryAfter time.Duration, ok bool) {
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindRetryable {
		return 0, false
	}
	return e.RetryAfter, true
}

// IsAmbiguous reports whether err is a failure after which the downstream may have the
// message: one marked with Ambiguous, or one not marked at all. A nil err is not a
// failure.
func IsAmbiguous(err error) bool { return err != nil && KindOf(err) == KindAmbiguous }

// maxRetryAfter caps the wait a Retry-After may ask for.
const maxRetryAfter = 365 * 24 * time.Hour

// ParseRetryAfter reads an HTTP Retry-After header (RFC 9110: delay seconds or an HTTP
// date) as the wait from now; 0 when it is empty, malformed or in the past.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	secs, err := strconv.Atoi(v)
	if err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(min(secs, int(maxRetryAfter/time.Second))) * time.Second
	}
	if errors.Is(err, strconv.ErrRange) {
		// Delay seconds beyond any int: as long a wait as a Retry-After may ask for (or
		// none, for a negative one).
		if strings.HasPrefix(v, "-") {
			return 0
		}
		return maxRetryAfter
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}
