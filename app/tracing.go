package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TracingEnabled reports whether the OTEL_* environment asks for a trace exporter: one of
// OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER
// is set, OTEL_TRACES_EXPORTER is not "none" and OTEL_SDK_DISABLED is not "true".
func TracingEnabled(lookupEnv func(string) (string, bool)) bool {
	get := func(k string) string { v, _ := lookupEnv(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(get("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" ||
		get("OTEL_TRACES_EXPORTER") != ""
}

// SetupTracing sets the global OpenTelemetry propagator (W3C trace context and baggage)
// and, when [TracingEnabled], a global tracer provider that exports through the exporter
// the OTEL_* variables choose (OTEL_TRACES_EXPORTER: otlp by default, or console;
// OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf by default, or grpc; the endpoint, headers
// and timeouts from OTEL_EXPORTER_OTLP_*; the sampler from OTEL_TRACES_SAMPLER; the
// service name from OTEL_SERVICE_NAME, else "outbox"). Otherwise spans are not recorded.
// The returned function flushes and stops the provider.
func SetupTracing(ctx context.Context) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !TracingEnabled(os.LookupEnv) {
		return func(context.Context) error { return nil }, nil
	}
	exporter, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("trace exporter (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*): %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "outbox")),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil {
		return nil, fmt.Errorf("trace resource (OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// StartTracing runs [SetupTracing] for the App's process; Close flushes the traces. A
// trace exporter that cannot be built is logged and tracing stays off: delivery does not
// depend on it.
func (a *App) StartTracing(ctx context.Context) {
	shutdown, err := SetupTracing(ctx)
	if err != nil {
		a.log().Warn("Tracing is off", slog.Any("error", err))
		return
	}
	a.tel.mu.Lock()
	a.tel.shutdowns = append(a.tel.shutdowns, shutdown)
	a.tel.mu.Unlock()
	if TracingEnabled(os.LookupEnv) {
		a.log().Info("Tracing on: spans exported as the OTEL_* variables say")
	}
}
