//go:build !unix

package pgcluster

import (
	"context"
	"errors"
)

// Cluster is a private PostgreSQL cluster; this system cannot run one.
type Cluster struct{}

func Start(context.Context, Options) (*Cluster, error) {
	return nil, errors.New("a private PostgreSQL cluster runs only on Unix systems: set DATABASE_URL to a database you run")
}

func (c *Cluster) URL() string               { return "" }
func (c *Cluster) Stop()                     {}
func (c *Cluster) Exited() <-chan struct{}   { return nil }
func (c *Cluster) PID() int                  { return 0 }
func (c *Cluster) DataDir() (string, string) { return "", "" }

func RemoveRelocated(string) error { return nil }
