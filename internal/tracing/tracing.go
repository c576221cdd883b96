// Package tracing carries OpenTelemetry trace context through the outbox: from the
// business transaction that enqueues a message (into the row's headers), to the send
// activity (out of them), to the HTTP request that delivers it.
package tracing

import (
	"context"
	"slices"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TraceParent is the W3C trace context header.
const TraceParent = "traceparent"

// Propagator returns p, or when p is nil the global propagator with a W3C trace context
// fallback: when the global one writes no traceparent (the default global propagator
// writes nothing) the fallback writes traceparent and tracestate, and when it reads no
// span context the fallback reads traceparent. So the headers of a row always speak W3C,
// whatever the writing process configured.
func Propagator(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p != nil {
		return p
	}
	return fallback{}
}

type fallback struct{}

func (fallback) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	otel.GetTextMapPropagator().Inject(ctx, c)
	if c.Get(TraceParent) == "" {
		propagation.TraceContext{}.Inject(ctx, c)
	}
}

func (fallback) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	before := trace.SpanContextFromContext(ctx)
	out := otel.GetTextMapPropagator().Extract(ctx, c)
	if sc := trace.SpanContextFromContext(out); !sc.IsValid() || sc.Equal(before) {
		out = propagation.TraceContext{}.Extract(out, c)
	}
	return out
}

func (fallback) Fields() []string {
	f := slices.Clone(otel.GetTextMapPropagator().Fields())
	for _, k := range (propagation.TraceContext{}).Fields() {
		if !slices.Contains(f, k) {
			f = append(f, k)
		}
	}
	return f
}

// Headers returns h with the trace context of ctx's span added, as p (see [Propagator])
// writes it; keys h already has, in any case, are kept as they are, and a traceparent of
// h's keeps out the span's tracestate too, which belongs to another trace. It returns h
// itself when ctx has no valid span context.
func Headers(ctx context.Context, p propagation.TextMapPropagator, h map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return h
	}
	carrier := propagation.MapCarrier{}
	Propagator(p).Inject(ctx, carrier)
	if len(carrier) == 0 {
		return h
	}
	own := make(map[string]bool, len(h))
	for k := range h {
		own[strings.ToLower(k)] = true
	}
	out := make(map[string]string, len(h)+len(carrier))
	for k, v := range carrier {
		k := strings.ToLower(k)
		if v != "" && !own[k] && !(k == "tracestate" && own["traceparent"]) {
			out[k] = v
		}
	}
	for k, v := range h {
		out[k] = v
	}
	return out
}

// Replace puts the trace context of ctx's span into h, as the default [Propagator] writes
// it, in place of the one h carries: a send writes its own span's context on the message
// it delivers, and that span is a child of the one h named. The W3C fields are removed in
// any case of their names first (a propagator writes only what is missing, and h may hold
// both spellings) when ctx has a valid span. h is changed and returned; a nil h is made.
func Replace(ctx context.Context, h map[string]string) map[string]string {
	if h == nil {
		h = map[string]string{}
	}
	if trace.SpanContextFromContext(ctx).IsValid() {
		for _, f := range (propagation.TraceContext{}).Fields() {
			for k := range h {
				if strings.EqualFold(k, f) {
					delete(h, k)
				}
			}
		}
	}
	Propagator(nil).Inject(ctx, propagation.MapCarrier(h))
	return h
}

// SpanContext returns the remote span context that headers h carry, as p (see
// [Propagator]) reads it; the result is invalid when h has none.
func SpanContext(p propagation.TextMapPropagator, h map[string]string) trace.SpanContext {
	if len(h) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(Propagator(p).Extract(context.Background(), propagation.MapCarrier(h)))
}
