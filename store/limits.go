package store

// MaxPayloadBytes returns the payload size limit of this store: Config.MaxPayloadBytes, or
// DefaultMaxPayloadBytes. Enqueue enforces it; the send activity applies it to rows that
// other programs inserted with plain SQL.
func (s *Store) MaxPayloadBytes() int { return s.cfg.MaxPayloadBytes }
