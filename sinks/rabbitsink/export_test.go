package rabbitsink

import (
	"context"
	"net"
	"time"
)

// BreakConnection closes the TCP connection under the sink's AMQP connection, as a lost
// network or a crashed broker would, and reports whether the sink had one.
func (s *Sink) BreakConnection() bool {
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	if conn == nil || conn.net == nil {
		return false
	}
	_ = conn.net.Close()
	return true
}

// Connected reports whether the sink holds an open connection.
func (s *Sink) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn != nil && !s.conn.amqp.IsClosed()
}

// LocalPort returns the client-side TCP port of the sink's connection, or 0 without one.
func (s *Sink) LocalPort() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil || s.conn.net == nil {
		return 0
	}
	if addr, ok := s.conn.net.LocalAddr().(*net.TCPAddr); ok {
		return addr.Port
	}
	return 0
}

// IdleChannels returns the number of channels in the sink's pool.
func (s *Sink) IdleChannels() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.idle)
}

// SetRetireTimeout sets how long a retired connection of the sink may live.
func (s *Sink) SetRetireTimeout(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retireFor = d
}

// RetiredConnections returns the number of retired connections the sink has not closed.
func (s *Sink) RetiredConnections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.retired)
}

// OpenChannels fills the sink's pool with n channels, connecting first if it must.
func (s *Sink) OpenChannels(ctx context.Context, n int) error {
	held := make([]*pubChannel, 0, n)
	defer func() {
		for _, c := range held {
			s.release(c, true)
			<-s.slots
		}
	}()
	for range n {
		c, err := s.acquire(ctx)
		if err != nil {
			return err
		}
		held = append(held, c)
	}
	return nil
}
