package store_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

func TestEnqueueTraceContext(t *testing.T) {
	t.Parallel()
	pool, st := testdb.Schema(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	enqueue := func(t *testing.T, st *store.Store, ctx context.Context, headers map[string]string) map[string]string {
		t.Helper()
		id, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`), Headers: headers})
		require.NoError(t, err)
		row, err := st.Get(context.Background(), id)
		require.NoError(t, err)
		return row.Headers
	}
	traceparent := func(sc trace.SpanContext) string {
		return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	}

	t.Run("NoSpanWritesNoTraceContext", func(t *testing.T) {
		t.Parallel()
		require.Empty(t, enqueue(t, st, context.Background(), nil))
		require.Equal(t, map[string]string{"tenant": "7"}, enqueue(t, st, context.Background(), map[string]string{"tenant": "7"}))
	})

	t.Run("SpanWritesTraceparentBesideCallerHeaders", func(t *testing.T) {
		t.Parallel()
		ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
		defer span.End()
		h := enqueue(t, st, ctx, map[string]string{"tenant": "7"})
		require.Equal(t, traceparent(span.SpanContext()), h["traceparent"])
		require.Equal(t, "7", h["tenant"])
	})

	t.Run("CallerTraceparentIsKept", func(t *testing.T) {
		t.Parallel()
		ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
		defer span.End()
		const mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		h := enqueue(t, st, ctx, map[string]string{"traceparent": mine})
		require.Equal(t, mine, h["traceparent"])
	})

	t.Run("CallerTraceparentKeepsTheSpansTraceOut", func(t *testing.T) {
		// The caller's trace context, under any case of its names, wins whole: the span's
		// tracestate, of another trace, is not paired with it.
		t.Parallel()
		state, err := trace.ParseTraceState("vendor=ctx-span-state")
		require.NoError(t, err)
		parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2},
			TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true})
		ctx, span := tp.Tracer("test").Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "place order")
		defer span.End()
		require.Equal(t, "vendor=ctx-span-state", span.SpanContext().TraceState().String())
		const mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		require.Equal(t, map[string]string{"Traceparent": mine}, enqueue(t, st, ctx, map[string]string{"Traceparent": mine}))
		require.Equal(t, map[string]string{"traceparent": mine}, enqueue(t, st, ctx, map[string]string{"traceparent": mine}))
	})

	t.Run("ConfiguredPropagatorIsUsed", func(t *testing.T) {
		t.Parallel()
		custom, err := store.New(pool, store.Config{Schema: st.Schema(), Propagator: propagation.Baggage{}})
		require.NoError(t, err)
		member, err := baggage.NewMember("tenant", "7")
		require.NoError(t, err)
		bag, err := baggage.New(member)
		require.NoError(t, err)
		ctx, span := tp.Tracer("test").Start(baggage.ContextWithBaggage(context.Background(), bag), "place order")
		defer span.End()
		h := enqueue(t, custom, ctx, nil)
		require.Equal(t, "tenant=7", h["baggage"])
		require.NotContains(t, h, "traceparent")
	})
}
