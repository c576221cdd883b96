// Package temporalx connects to Temporal and makes sure the outbox's search attributes
// exist.
package temporalx

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"

	"github.com/outbox-go/outbox/codec"
	"github.com/outbox-go/outbox/workflows"
)

// Options says where Temporal is.
type Options struct {
	Address   string
	Namespace string
	Logger    *slog.Logger
	// MetricsHandler receives the SDK's metrics (requests, polls, workflow and activity
	// latencies). Nil drops them.
	MetricsHandler client.MetricsHandler

	// TLS secures the connection (CAs, client certificate for mutual TLS). Nil is
	// plaintext, unless APIKey is set: then TLS with the system's roots, as the SDK does.
	TLS *tls.Config
	// TLSDisabled keeps the connection plaintext even with an API key.
	TLSDisabled bool
	// APIKey is sent as a bearer token on every call. It is never logged.
	APIKey string
	// Headers are gRPC metadata sent with every call (a proxy's routing or tenant header).
	// They are never logged.
	Headers map[string]string
	// Authority is the :authority pseudo-header of the connection, when set.
	Authority string
	// Codec, when set, encodes every payload the client sends and decodes what it
	// receives; failure messages and stack traces are encoded with it too.
	Codec converter.PayloadCodec
}

// String describes o without its secrets.
func (o Options) String() string {
	return fmt.Sprintf("Temporal at %s (namespace %s, TLS %t, API key %t, codec %t)",
		o.Address, o.Namespace, o.TLS != nil || (o.APIKey != "" && !o.TLSDisabled), o.APIKey != "", o.Codec != nil)
}

// ClientOptions returns the SDK client options Dial uses: the connection's security and
// headers, the codec's data and failure converters, the logger, the metrics handler and the
// tracing interceptor.
func ClientOptions(o Options) (client.Options, error) {
	opts := client.Options{HostPort: o.Address, Namespace: o.Namespace, MetricsHandler: o.MetricsHandler}
	if o.Logger != nil {
		opts.Logger = sdklog.NewStructuredLogger(o.Logger)
	}
	if o.TLS != nil && o.TLSDisabled {
		return opts, errors.New("temporal: TLS is both configured and disabled")
	}
	opts.ConnectionOptions.TLS = o.TLS
	opts.ConnectionOptions.TLSDisabled = o.TLSDisabled
	if o.APIKey != "" {
		opts.Credentials = client.NewAPIKeyStaticCredentials(o.APIKey)
	}
	if len(o.Headers) > 0 {
		opts.HeadersProvider = fixedHeaders(maps.Clone(o.Headers))
	}
	opts.ConnectionOptions.Authority = o.Authority
	if o.Codec != nil {
		opts.DataConverter = codec.DataConverter(o.Codec)
		opts.FailureConverter = codec.FailureConverter(opts.DataConverter)
	}
	tracer, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{})
	if err != nil {
		return opts, fmt.Errorf("temporal tracing interceptor: %w", err)
	}
	opts.Interceptors = append(opts.Interceptors, tracer)
	return opts, nil
}

// fixedHeaders sends the same gRPC metadata with every call.
type fixedHeaders map[string]string

func (h fixedHeaders) GetHeaders(context.Context) (map[string]string, error) { return h, nil }

// Dial connects to the Temporal frontend and checks that it answers. The client carries
// the SDK's OpenTelemetry tracing interceptor with the global tracer provider: workflow
// starts, workflows and activities get spans (no-op ones until a provider is set), and an
// activity's context carries its span. See [ClientOptions] for the rest.
func Dial(ctx context.Context, o Options) (client.Client, error) {
	opts, err := ClientOptions(o)
	if err != nil {
		return nil, err
	}
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s (namespace %s): %w%s", o.Address, o.Namespace, redact(err, o.APIKey), dialHint(err, o))
	}
	return c, nil
}

// dialHint suggests the setting to look at when a dial failed on TLS.
func dialHint(err error, o Options) string {
	msg := err.Error()
	tlsOn := o.TLS != nil || (o.APIKey != "" && !o.TLSDisabled)
	closed := strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset") || strings.Contains(msg, "EOF")
	switch {
	case strings.Contains(msg, "x509:"):
		return "; check temporal.tls.ca_file (TEMPORAL_TLS_CA) and temporal.tls.server_name (TEMPORAL_TLS_SERVER_NAME)"
	case !tlsOn && (closed || strings.Contains(msg, "server preface") || strings.Contains(msg, "tls")):
		return "; if the server requires TLS, set temporal.tls (TEMPORAL_TLS_CA, and TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY for mutual TLS)"
	case tlsOn && (o.TLS == nil || len(o.TLS.Certificates) == 0) && (closed || strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate")):
		return "; if the server requires mutual TLS, set temporal.tls.cert_file and key_file (TEMPORAL_TLS_CERT, TEMPORAL_TLS_KEY)"
	case tlsOn && strings.Contains(msg, "tls:"):
		return "; check the TLS settings: temporal.tls.* (TEMPORAL_TLS_*)"
	}
	return ""
}

// redact replaces the API key in err's message, should a server or proxy echo it.
func redact(err error, apiKey string) error {
	if apiKey == "" || !strings.Contains(err.Error(), apiKey) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), apiKey, "[redacted]"))
}

// CheckSearchAttributes returns an error naming the outbox's search attributes that are
// missing from the namespace (or have the wrong type), and nil when all are there.
func CheckSearchAttributes(ctx context.Context, c client.Client, namespace string) error {
	missing, err := missingSearchAttributes(ctx, c, namespace)
	if isNotFound(err) {
		return namespaceNotFound(namespace, err)
	}
	if err != nil {
		return fmt.Errorf("list search attributes of namespace %s: %w", namespace, err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("search attributes %s are missing in namespace %s", strings.Join(missing, ", "), namespace)
	}
	return nil
}

// EnsureSearchAttributes checks that the outbox's Keyword search attributes exist in the
// namespace and creates the missing ones through the operator service. When it cannot, it
// returns an error naming them and the command that creates them.
func EnsureSearchAttributes(ctx context.Context, c client.Client, namespace string) error {
	missing, err := missingSearchAttributes(ctx, c, namespace)
	if isNotFound(err) {
		return namespaceNotFound(namespace, err)
	}
	if Unanswered(err) {
		return fmt.Errorf("read the search attributes of namespace %q: %w", namespace, err)
	}
	if err != nil && ctx.Err() != nil {
		// Stopped while asking (the process is shutting down): no answer about them.
		return fmt.Errorf("read the search attributes of namespace %q: %w", namespace, ctx.Err())
	}
	if err != nil {
		return searchAttributeError(namespace, workflows.SearchAttributeNames, err)
	}
	if len(missing) == 0 {
		return nil
	}
	req := &operatorservice.AddSearchAttributesRequest{Namespace: namespace, SearchAttributes: map[string]enumspb.IndexedValueType{}}
	for _, name := range missing {
		req.SearchAttributes[name] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
	}
	_, err = c.OperatorService().AddSearchAttributes(ctx, req)
	var exists *serviceerror.AlreadyExists
	if Unanswered(err) || (err != nil && ctx.Err() != nil) {
		return fmt.Errorf("create search attributes %s in namespace %q: %w", strings.Join(missing, ", "), namespace, cmp.Or(ctx.Err(), err))
	}
	if err != nil && !errors.As(err, &exists) {
		return searchAttributeError(namespace, missing, err)
	}
	// Another process may have added them at the same time; either way, look again.
	if missing, err = missingSearchAttributes(ctx, c, namespace); err != nil && ctx.Err() != nil {
		return fmt.Errorf("read the search attributes of namespace %q: %w", namespace, ctx.Err())
	} else if err != nil || len(missing) > 0 {
		return searchAttributeError(namespace, missing, err)
	}
	return nil
}

// CheckNamespace makes sure namespace exists, for a process that does not read its search
// attributes (which finds a missing namespace too): a namespace not found is a
// namespaceNotFoundError (IsNamespaceNotFound), a Temporal that does not answer an error
// Unanswered reports. Any other refusal (a key that may not describe the namespace) is no
// proof that it is missing, and passes: the worker's polls report what is wrong.
func CheckNamespace(ctx context.Context, c client.Client, namespace string) error {
	_, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: namespace})
	switch {
	case err == nil:
		return nil
	case isNotFound(err):
		return namespaceNotFound(namespace, err)
	case Unanswered(err):
		return fmt.Errorf("describe namespace %q: %w", namespace, err)
	case ctx.Err() != nil:
		return fmt.Errorf("describe namespace %q: %w", namespace, ctx.Err())
	}
	return nil
}

// Unanswered reports whether err is Temporal not answering in time (unavailable, or past
// a deadline), which a later try may cure, rather than an answer.
func Unanswered(err error) bool {
	var (
		unavailable *serviceerror.Unavailable
		deadline    *serviceerror.DeadlineExceeded
	)
	return errors.As(err, &unavailable) || errors.As(err, &deadline) || errors.Is(err, context.DeadlineExceeded)
}

// namespaceNotFoundError is the error of a namespace the server does not have.
type namespaceNotFoundError struct {
	namespace string
	cause     error
}

func (e *namespaceNotFoundError) Error() string {
	return fmt.Sprintf("namespace %q not found (%v); set temporal.namespace (TEMPORAL_NAMESPACE) to an existing one or create it with:\n"+
		"  temporal operator namespace create --namespace %s", e.namespace, e.cause, e.namespace)
}

func (e *namespaceNotFoundError) Unwrap() error { return e.cause }

func namespaceNotFound(namespace string, cause error) error {
	return &namespaceNotFoundError{namespace: namespace, cause: cause}
}

// IsNamespaceNotFound reports whether err says the configured namespace does not exist.
func IsNamespaceNotFound(err error) bool {
	var nf *namespaceNotFoundError
	return errors.As(err, &nf)
}

// isNotFound reports whether a Temporal call failed because its namespace does not exist.
func isNotFound(err error) bool {
	var nsNotFound *serviceerror.NamespaceNotFound
	var notFound *serviceerror.NotFound
	return errors.As(err, &nsNotFound) || errors.As(err, &notFound)
}

func missingSearchAttributes(ctx context.Context, c client.Client, namespace string) ([]string, error) {
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, name := range workflows.SearchAttributeNames {
		typ, ok := resp.GetCustomAttributes()[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		if typ != enumspb.INDEXED_VALUE_TYPE_KEYWORD {
			return nil, fmt.Errorf("search attribute %s has type %s, want Keyword", name, typ)
		}
	}
	return missing, nil
}

func searchAttributeError(namespace string, names []string, cause error) error {
	if len(names) == 0 {
		names = workflows.SearchAttributeNames
	}
	var cmds []string
	for _, n := range slices.Clone(names) {
		cmds = append(cmds, fmt.Sprintf("  temporal operator search-attribute create --namespace %s --name %s --type Keyword", namespace, n))
	}
	msg := fmt.Sprintf("search attributes %s are missing in namespace %q and cannot be created here", strings.Join(names, ", "), namespace)
	if cause != nil {
		msg += fmt.Sprintf(" (%v)", cause)
	}
	return fmt.Errorf("%s; create them with:\n%s\nor set search_attributes: false in the config", msg, strings.Join(cmds, "\n"))
}
