//go:build !unix

package mariadbserver

import (
	"context"
	"errors"
)

// Server is a private MariaDB or MySQL server; this system cannot run one.
type Server struct{}

// Start reports that a private server runs only on Unix systems.
func Start(context.Context, Options) (*Server, error) {
	return nil, errors.New("a private MariaDB server runs only on Unix systems: set DATABASE_URL to a MySQL or MariaDB database you run")
}

func (s *Server) URL() string             { return "" }
func (s *Server) DataDir() string         { return "" }
func (s *Server) Product() string         { return "" }
func (s *Server) Stop()                   {}
func (s *Server) Exited() <-chan struct{} { return nil }
func (s *Server) PID() int                { return 0 }
