package rabbitsink

import "net"

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
