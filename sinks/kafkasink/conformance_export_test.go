package kafkasink

import (
	"context"
	"net"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DialThrough makes the sink's client dial every broker with dial (a test's fault proxy).
// Call it before Open or the first Send: the client is created then.
func (s *Sink) DialThrough(dial func(ctx context.Context, network, host string) (net.Conn, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts = append(s.opts, kgo.Dialer(dial))
}
