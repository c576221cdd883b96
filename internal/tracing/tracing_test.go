package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// Replace writes the span's trace context in place of the one the headers carry, under
// any case of its names, and keeps the other headers.
func TestReplace(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3},
		SpanID:     trace.SpanID{4, 5, 6},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	h := Replace(ctx, map[string]string{
		"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"TRACESTATE":  "vendor=old",
		"tenant":      "t-1",
	})
	want := "00-01020300000000000000000000000000-0405060000000000-01"
	if len(h) != 2 || h["traceparent"] != want || h["tenant"] != "t-1" {
		t.Fatalf("got %v, want traceparent %s and tenant t-1 only", h, want)
	}

	if h := Replace(ctx, nil); h["traceparent"] != want {
		t.Fatalf("a nil map: got %v", h)
	}
	kept := map[string]string{"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	if h := Replace(context.Background(), kept); len(h) != 1 || h["Traceparent"] == "" {
		t.Fatalf("without a span the headers stay: got %v", h)
	}
}
