package activities_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/activities"
	"github.com/outbox-go/outbox/delivery"
)

// connSink counts its opens and closes; fail makes Open fail.
type connSink struct {
	opens, closes int
	fail          bool
}

func (s *connSink) Send(context.Context, delivery.Message) error { return nil }
func (s *connSink) Open(context.Context) error {
	s.opens++
	if s.fail {
		return delivery.Permanent(errors.New("stream not found"))
	}
	return nil
}
func (s *connSink) Close() error { s.closes++; return nil }

func TestRegistryOpensAndClosesEachHandlerOnce(t *testing.T) {
	t.Parallel()
	shared, broken, fallback := &connSink{}, &connSink{fail: true}, &connSink{}
	r := activities.NewRegistry()
	r.Handle("a", shared)
	r.Handle("b", shared) // one sink serving two topics
	r.Handle("c", broken)
	r.Handle("d", delivery.HandlerFunc(func(context.Context, delivery.Message) error { return nil }))
	r.HandleDefault(fallback)

	err := r.Open(context.Background())
	require.EqualError(t, err, "topic c: stream not found")
	require.NoError(t, r.Close())
	for _, s := range []*connSink{shared, broken, fallback} {
		require.Equal(t, 1, s.opens)
		require.Equal(t, 1, s.closes)
	}
}
