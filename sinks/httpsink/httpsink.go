package activities

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/internal/tracing"
	"github.com/outbox-go/outbox/webhook"
)

// HTTPSink delivers messages by POSTing them as JSON:
//
//	{"message_id": "...", "topic": "...", "payload": {...}, "created_at": "..."}
//
// with the headers Content-Type: application/json, Idempotency-Key: <message_id> and
// X-Outbox-Attempt: <n>. A 2xx answer means delivered; 408, 429, 5xx are retried (honouring
// Retry-After); a connection error or timeout is retried, after a check when the request
// may have reached the receiver; any other answer is a permanent failure. Redirects are not followed. The request carries the trace context
// of the send span (traceparent, tracestate), so the receiver's span joins the trace.
//
// With SigningKeys, every POST is signed by the Standard Webhooks convention (see package
// webhook): webhook-id is the message ID, the same on every attempt, so a receiver can
// de-duplicate by it; webhook-timestamp is the time of the attempt; webhook-signature
// holds one v1 signature per key, over the exact bytes of the body sent, so a receiver
// that rotates its secret verifies with either the old or the new one. The signature
// headers replace any of the same name in Headers. The GETs of CheckProcessed carry no
// body and are not signed; authenticate them with Headers.
type HTTPSink struct {
	URL      string
	CheckURL string // with {message_id}; empty when the downstream cannot be asked
	Headers  map[string]string
	// SigningKeys are the raw keys that sign each POST; empty sends unsigned requests.
	SigningKeys [][]byte
	Client      *http.Client
}

// NewHTTPSink returns the http sink of a topic's sink settings. Its client does not follow
// redirects; with TLS settings it trusts their CAs (instead of the system's roots), presents
// their client certificate for mutual TLS and expects their server name. Errors name the
// setting at fault (url, tls.ca_file, signing_secrets[i], ...).
func NewHTTPSink(t SinkConfig) (*HTTPSink, error) {
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
		case secure && cu.Scheme != "https":
			return nil, fmt.Errorf("check_url: must use https as url does, got %s: the check's requests carry the topic's headers", redact.URL(t.CheckURL))
		case !t.TLS.IsZero() && !strings.EqualFold(cu.Hostname(), u.Hostname()):
			return nil, fmt.Errorf("check_url: must be on url's host %s when tls is set, got %s", u.Hostname(), redact.URL(t.CheckURL))
		}
	}
	for i, key := range t.SigningSecrets {
		if len(key) == 0 {
			return nil, fmt.Errorf("signing_secrets[%d]: the key is empty", i)
		}
	}
	client := &http.Client{
		// The activity's start-to-close timeout bounds each request through its
		// context; this is a backstop.
		Timeout: 5 * time.Minute,
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
	return &HTTPSink{
		URL:         t.URL,
		CheckURL:    t.CheckURL,
		Headers:     t.Headers,
		SigningKeys: t.SigningSecrets,
		Client:      client,
	}, nil
}

type httpBody struct {
	MessageID string          `json:"message_id"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

// Send POSTs the message.
func (s *HTTPSink) Send(ctx context.Context, d Delivery) error {
	body, err := json.Marshal(httpBody{MessageID: d.MessageID.String(), Topic: d.Topic, Payload: d.Payload, CreatedAt: d.CreatedAt.UTC()})
	if err != nil {
		return Permanent(fmt.Errorf("encode request body: %w", err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(body))
	if err != nil {
		return Permanent(fmt.Errorf("build request to %s: %w", redact.URL(s.URL), err))
	}
	for k, v := range s.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", d.MessageID.String())
	req.Header.Set("X-Outbox-Attempt", strconv.Itoa(d.Attempt))
	req.Header.Set("X-Outbox-Topic", d.Topic)
	// The receiver's span continues the send span, and so the enqueuing trace.
	tracing.Propagator(nil).Inject(ctx, propagation.HeaderCarrier(req.Header))
	if len(s.SigningKeys) > 0 {
		// body is what the request sends, byte for byte.
		webhook.SetHeaders(req.Header, d.MessageID.String(), time.Now(), body, s.SigningKeys...)
	}

	resp, err := s.Client.Do(req)
	if err != nil {
		return transportError("POST", redact.URL(s.URL), err)
	}
	defer resp.Body.Close()
	snippet := readSnippet(resp.Body)
	failure := fmt.Errorf("POST %s: HTTP %d%s", redact.URL(s.URL), resp.StatusCode, snippet)
	wait := retryAfter(resp.Header.Get("Retry-After"), time.Now())
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		// The receiver turned the request away before processing it.
		return Retryable(failure, wait)
	case code >= 500:
		// A 500 may come after the receiver committed; a 502 or 504 from a gateway says
		// nothing about the receiver behind it.
		return &HandlerError{Err: failure, RetryAfter: wait, kind: kindAmbiguous}
	default:
		return Permanent(failure)
	}
}

// CheckProcessed asks CheckURL: 200 means processed, 404 means not. The GET is not signed.
func (s *HTTPSink) CheckProcessed(ctx context.Context, d Delivery) (bool, error) {
	if s.CheckURL == "" {
		return false, ErrCheckUnsupported
	}
	u := strings.ReplaceAll(s.CheckURL, "{message_id}", url.PathEscape(d.MessageID.String()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, fmt.Errorf("build request to %s: %w", redact.URL(u), err)
	}
	for k, v := range s.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Idempotency-Key", d.MessageID.String())
	tracing.Propagator(nil).Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := s.Client.Do(req)
	if err != nil {
		return false, fmt.Errorf("GET %s: %w", redact.URL(u), unwrapURLError(err))
	}
	defer resp.Body.Close()
	snippet := readSnippet(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	default:
		return false, fmt.Errorf("GET %s: HTTP %d%s (want 200 or 404)", redact.URL(u), resp.StatusCode, snippet)
	}
}

// transportError classifies a failed round trip: a connection that was never made cannot
// have delivered anything (nor can one whose server certificate the sink rejected, which
// happens before the request is written); anything later (a reset, a timeout) may have.
func transportError(method, u string, err error) error {
	wrapped := fmt.Errorf("%s %s: %w", method, u, unwrapURLError(err))
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return Retryable(wrapped, 0)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return Retryable(wrapped, 0)
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		return Retryable(wrapped, 0)
	}
	return Ambiguous(wrapped)
}

// readSnippet returns the start of a response body for an error message, and drains the
// rest so the connection can be reused.
func readSnippet(r io.Reader) string {
	buf, _ := io.ReadAll(io.LimitReader(r, 256))
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 1<<20))
	s := strings.TrimSpace(strings.ToValidUTF8(string(buf), "?"))
	if s == "" {
		return ""
	}
	return ": " + s
}

// retryAfter reads a Retry-After header: delay seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(min(secs, 365*24*3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// unwrapURLError drops the *url.Error wrapper, whose text repeats the full URL.
func unwrapURLError(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}
