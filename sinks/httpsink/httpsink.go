// Package httpsink is the http sink: it delivers a topic's messages by POSTing them to a
// webhook (sink: http, the default).
package httpsink

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/httpx"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/internal/tracing"
	"github.com/outbox-go/outbox/sinks"
	"github.com/outbox-go/outbox/webhook"
)

// Sink delivers messages by POSTing them as JSON:
//
//	{"message_id": "...", "topic": "...", "payload": {...}, "created_at": "..."}
//
// with the headers Content-Type: application/json, Idempotency-Key: <message_id>, the
// outbox's headers every sink sets (Outbox-Message-Id, Outbox-Topic, Outbox-Created-At,
// Outbox-Attempt, Outbox-Ordering-Key when the message has one: see package sinks) and,
// for one release, X-Outbox-Attempt and X-Outbox-Topic as before them. A 2xx answer means
// delivered; 408, 429, 5xx are retried (honouring Retry-After); a connection error or
// timeout is retried, after a check when the request may have reached the receiver; any
// other answer is a permanent failure. Redirects are not followed. The request carries
// the trace context of the send span (traceparent, tracestate), so the receiver's span
// joins the trace. The message's own headers (the row's) are not sent: a row must not set
// a request's Authorization.
//
// With SigningKeys, every POST is signed by the Standard Webhooks convention (see package
// webhook): webhook-id is the message ID, the same on every attempt, so a receiver can
// de-duplicate by it; webhook-timestamp is the time of the attempt; webhook-signature
// holds one v1 signature per key, over the exact bytes of the body sent, so a receiver
// that rotates its secret verifies with either the old or the new one. The signature
// headers replace any of the same name in Headers. The GETs of CheckProcessed carry no
// body and are not signed; authenticate them with Headers.
type Sink struct {
	URL      string
	CheckURL string // with {message_id}; empty when the downstream cannot be asked
	Headers  map[string]string
	// SigningKeys are the raw keys that sign each POST; empty sends unsigned requests.
	SigningKeys [][]byte
	Client      *http.Client
}

// Config is an http topic's sink settings: the keys of a topic with sink: http (or none).
type Config struct {
	// URL receives the POSTs: an absolute http or https URL. Required.
	URL string
	// CheckURL, with {message_id} in it, answers 200 when the downstream already has a
	// message and 404 when it does not. Optional: without it a message whose send was
	// ambiguous is sent again.
	CheckURL string
	// Headers are added to every request (an Authorization, for example). Optional.
	Headers map[string]string
	// TLS secures the connection: the CAs to trust instead of the system's roots, a
	// client certificate for mutual TLS. Optional; needs an https URL.
	TLS sinks.TLSFiles
	// SigningSecrets sign every POST by the Standard Webhooks convention, one v1
	// signature per secret (raw key bytes, see webhook.ParseSecret). Optional.
	SigningSecrets [][]byte
}

// New returns the http sink of a topic's sink settings. Its client does not follow
// redirects; with TLS settings it trusts their CAs (instead of the system's roots), presents
// their client certificate for mutual TLS and expects their server name. Errors name the
// setting at fault (url, tls.ca_file, signing_secrets[i], ...).
func New(t Config) (*Sink, error) {
	if t.URL == "" {
		return nil, errors.New("url: the http sink needs a url")
	}
	u, err := url.Parse(t.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("url: must be an absolute http or https URL, got %q", redact.URL(t.URL))
	}
	secure := u.Scheme == "https" // url.Parse lower-cases the scheme: HTTPS:// is https
	if !t.TLS.IsZero() && !secure {
		return nil, fmt.Errorf("tls: is set, but url %s does not use TLS: use https://", redact.URL(t.URL))
	}
	if t.CheckURL != "" {
		// The check's GETs carry the topic's headers (an Authorization among them): a
		// topic that sends over TLS checks over TLS, and with tls set, on the same host.
		cu, err := url.Parse(t.CheckURL)
		switch {
		case err != nil || (cu.Scheme != "http" && cu.Scheme != "https") || cu.Host == "":
			return nil, fmt.Errorf("check_url: must be an absolute http or https URL, got %q", redact.URL(t.CheckURL))
		case !strings.Contains(t.CheckURL, "{message_id}"):
			// A check that asks the same URL for every message would answer for all of
			// them: a 200 would record messages sent that never arrived.
			return nil, fmt.Errorf("check_url: must contain {message_id}, got %q", redact.URL(t.CheckURL))
		case secure && cu.Scheme != "https":
			return nil, fmt.Errorf("check_url: must use https as url does, got %s: the check's requests carry the topic's headers", redact.URL(t.CheckURL))
		case !t.TLS.IsZero() && !strings.EqualFold(cu.Hostname(), u.Hostname()):
			return nil, fmt.Errorf("check_url: must be on url's host %s when tls is set, got %s", u.Hostname(), redact.URL(t.CheckURL))
		}
	}
	for name, value := range t.Headers {
		if err := checkHeader(name, value); err != nil {
			return nil, fmt.Errorf("headers[%q]: %w", name, err)
		}
	}
	for i, key := range t.SigningSecrets {
		if len(key) == 0 {
			return nil, fmt.Errorf("signing_secrets[%d]: the key is empty", i)
		}
	}
	client := &http.Client{
		// The activity's timeout (the topic's timeout) bounds each request through its
		// context; a context without a deadline gets backstop.
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	if !t.TLS.IsZero() {
		tlsConfig, err := t.TLS.Load()
		if err != nil {
			return nil, err
		}
		// A clone keeps the default transport's proxy, timeouts and HTTP/2, and gives the
		// topic connections of its own.
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.TLSClientConfig = tlsConfig
		client.Transport = transport
	}
	return &Sink{
		URL:         t.URL,
		CheckURL:    t.CheckURL,
		Headers:     t.Headers,
		SigningKeys: t.SigningSecrets,
		Client:      client,
	}, nil
}

// backstop bounds a request whose context has no deadline. An activity's context
// always has one (the topic's timeout), which may be longer.
const backstop = 5 * time.Minute

// withBackstop is ctx, bounded by backstop when it has no deadline of its own.
func withBackstop(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, backstop)
}

// checkHeader refuses a header that no request can carry: Go's client would refuse
// every request before writing it, and each attempt would count as ambiguous until the
// message was dead-lettered. The value is never shown: it may be a secret.
func checkHeader(name, value string) error {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool { return !isTokenChar(r) }) {
		return errors.New("is not an HTTP header name: letters, digits and !#$%&'*+-.^_`|~ only")
	}
	if strings.ContainsFunc(value, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
		return errors.New("the value holds a control character (a line break, say, inside a file: secret), which an HTTP header cannot carry")
	}
	return nil
}

// isTokenChar reports whether r may be part of a header name (RFC 9110's tchar).
func isTokenChar(r rune) bool {
	return r < 0x7f && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}

type httpBody struct {
	MessageID string          `json:"message_id"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

// Send POSTs the message.
func (s *Sink) Send(ctx context.Context, d delivery.Message) error {
	if strings.ContainsFunc(d.OrderingKey, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
		// A row written without Enqueue's check: no request can carry the key, and no
		// retry changes that.
		return delivery.Permanent(fmt.Errorf("ordering key %q holds a control character, which the %s header cannot carry", d.OrderingKey, sinks.HeaderOrderingKey))
	}
	body, err := json.Marshal(httpBody{MessageID: d.MessageID, Topic: d.Topic, Payload: d.Payload, CreatedAt: d.CreatedAt.UTC()})
	if err != nil {
		return delivery.Permanent(fmt.Errorf("encode request body: %w", err))
	}
	ctx, cancel := withBackstop(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(body))
	if err != nil {
		return delivery.Permanent(fmt.Errorf("build request to %s: %w", redact.URL(s.URL), err))
	}
	s.setHeaders(req)
	for k, v := range sinks.OutboxHeaders(d) {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", d.MessageID)
	// The names before the Outbox-* headers, kept for one release.
	req.Header.Set("X-Outbox-Attempt", strconv.Itoa(d.Attempt))
	req.Header.Set("X-Outbox-Topic", d.Topic)
	// The receiver's span continues the send span, and so the enqueuing trace.
	tracing.Propagator(nil).Inject(ctx, propagation.HeaderCarrier(req.Header))
	if len(s.SigningKeys) > 0 {
		// body is what the request sends, byte for byte.
		webhook.SetHeaders(req.Header, d.MessageID, time.Now(), body, s.SigningKeys...)
	}

	// Whether a whole request was written on some connection: the client repeats a POST
	// with an Idempotency-Key on a new connection when a reused one failed after the
	// request went out, and the error of that repeat (a refused dial) must not hide that
	// the receiver may have the first.
	var written atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				written.Store(true)
			}
		},
	}))
	resp, err := s.Client.Do(req)
	if err != nil {
		if written.Load() {
			return delivery.Ambiguous(fmt.Errorf("POST %s: %w (after the request was written)", redact.URL(s.URL), httpx.Unwrap(err)))
		}
		return transportError("POST", redact.URL(s.URL), err)
	}
	defer resp.Body.Close()
	snippet := httpx.Snippet(resp.Body)
	failure := fmt.Errorf("POST %s: HTTP %d%s", redact.URL(s.URL), resp.StatusCode, snippet)
	wait := delivery.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		// The receiver turned the request away before processing it.
		return delivery.Retryable(failure, wait)
	case code >= 500:
		// A 500 may come after the receiver committed; a 502 or 504 from a gateway says
		// nothing about the receiver behind it.
		return delivery.RetryAfter(delivery.Ambiguous(failure), wait)
	default:
		return delivery.Permanent(failure)
	}
}

// setHeaders sets the topic's headers on req. A Host header names the host the request
// asks for (an ingress or proxy that routes by name), which Go's client takes from
// req.Host, not from the headers.
func (s *Sink) setHeaders(req *http.Request) {
	for k, v := range s.Headers {
		req.Header.Set(k, v)
	}
	if host := req.Header.Get("Host"); host != "" {
		req.Host = host
		req.Header.Del("Host")
	}
}

// CheckProcessed asks CheckURL: 200 means processed, 404 means not. The GET is not signed.
func (s *Sink) CheckProcessed(ctx context.Context, d delivery.Message) (bool, error) {
	if s.CheckURL == "" {
		return false, delivery.ErrCheckUnsupported
	}
	u := strings.ReplaceAll(s.CheckURL, "{message_id}", url.PathEscape(d.MessageID))
	ctx, cancel := withBackstop(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, fmt.Errorf("build request to %s: %w", redact.URL(u), err)
	}
	s.setHeaders(req)
	req.Header.Set("Idempotency-Key", d.MessageID)
	tracing.Propagator(nil).Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := s.Client.Do(req)
	if err != nil {
		return false, fmt.Errorf("GET %s: %w", redact.URL(u), httpx.Unwrap(err))
	}
	defer resp.Body.Close()
	snippet := httpx.Snippet(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	default:
		return false, fmt.Errorf("GET %s: HTTP %d%s (want 200 or 404)", redact.URL(u), resp.StatusCode, snippet)
	}
}

// transportError classifies a failed round trip of which no request was written whole: a
// connection that was never made cannot have delivered anything (nor can one whose server
// certificate the sink rejected, which happens before the request is written); anything
// later (a reset, a timeout) may have.
func transportError(method, u string, err error) error {
	wrapped := fmt.Errorf("%s %s: %w", method, u, httpx.Unwrap(err))
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return delivery.Retryable(wrapped, 0)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return delivery.Retryable(wrapped, 0)
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return delivery.Retryable(wrapped, 0)
	}
	return delivery.Ambiguous(wrapped)
}
