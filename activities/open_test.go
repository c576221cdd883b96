package activities

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
)

// flakyOpener fails its first fails Opens with err, then succeeds.
type flakyOpener struct {
	delivery.HandlerFunc
	mu    sync.Mutex
	fails int
	err   error
	calls int
}

func (o *flakyOpener) Open(context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls++
	if o.calls <= o.fails {
		return o.err
	}
	return nil
}

func TestRegistryOpen(t *testing.T) {
	old := ReopenInterval
	ReopenInterval = 20 * time.Millisecond
	t.Cleanup(func() { ReopenInterval = old })
	noop := delivery.HandlerFunc(func(context.Context, delivery.Message) error { return nil })

	t.Run("AnUnreachableBrokerIsOpenedInTheBackground", func(t *testing.T) {
		down := &flakyOpener{HandlerFunc: noop, fails: 3, err: errors.New("connect to nats nats://127.0.0.1:1: connection refused")}
		r := NewRegistry()
		r.Handle("order.published", down)
		r.Handle("order.created", &flakyOpener{HandlerFunc: noop})
		var mu sync.Mutex
		var reports []string
		r.OnOpen = func(name string, err error) {
			mu.Lock()
			defer mu.Unlock()
			reports = append(reports, name+" "+map[bool]string{true: "ready", false: "down"}[err == nil])
		}
		require.NoError(t, r.Open(context.Background()), "a broker that cannot be reached now does not stop the start")
		require.Contains(t, r.NotReady(), "order.published")
		require.NotContains(t, r.NotReady(), "order.created")
		require.Eventually(t, func() bool { return len(r.NotReady()) == 0 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Close())
		mu.Lock()
		defer mu.Unlock()
		slices.Sort(reports) // the handlers open at once
		require.Equal(t, []string{"order.created ready", "order.published down", "order.published down", "order.published down", "order.published ready"}, reports)
	})

	t.Run("APermanentFailureStopsTheStart", func(t *testing.T) {
		r := NewRegistry()
		r.Handle("order.published", &flakyOpener{HandlerFunc: noop, fails: 1, err: delivery.Permanent(errors.New("no JetStream stream captures subject orders"))})
		err := r.Open(context.Background())
		require.ErrorContains(t, err, "topic order.published: no JetStream stream captures subject orders")
		require.NoError(t, r.Close())
	})

	t.Run("ASlowBrokerDoesNotHideAnothersPermanentFailure", func(t *testing.T) {
		r := NewRegistry()
		r.Handle("order.a", &blockingOpener{HandlerFunc: noop})
		r.Handle("order.b", &flakyOpener{HandlerFunc: noop, fails: 1, err: delivery.Permanent(errors.New("exchange orders not found"))})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := r.Open(ctx)
		require.ErrorContains(t, err, "topic order.b: exchange orders not found", "opened at once, not after order.a used up the time")
		require.Contains(t, r.NotReady(), "order.a")
		require.NoError(t, r.Close())
	})

	t.Run("TheDefaultHandlerIsNotATopic", func(t *testing.T) {
		r := NewRegistry()
		r.HandleDefault(&flakyOpener{HandlerFunc: noop, fails: 1 << 30, err: errors.New("connection refused")})
		r.Handle("default", &flakyOpener{HandlerFunc: noop})
		require.NoError(t, r.Open(context.Background()))
		require.Equal(t, []string{DefaultName}, slices.Collect(maps.Keys(r.NotReady())))
		require.NoError(t, r.Close())
	})

	t.Run("CloseStopsTheRetries", func(t *testing.T) {
		never := &flakyOpener{HandlerFunc: noop, fails: 1 << 30, err: errors.New("connection refused")}
		r := NewRegistry()
		r.Handle("order.published", never)
		require.NoError(t, r.Open(context.Background()))
		require.NoError(t, r.Close())
		never.mu.Lock()
		calls := never.calls
		never.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		never.mu.Lock()
		defer never.mu.Unlock()
		require.Equal(t, calls, never.calls, "no Open after Close")
	})
}

// blockingOpener's Open waits for its context to end.
type blockingOpener struct{ delivery.HandlerFunc }

func (o *blockingOpener) Open(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}
