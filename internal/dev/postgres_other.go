//go:build !unix

package dev

import (
	"context"
	"errors"
)

// pgCluster is not available on this system.
type pgCluster struct{}

func startPG(context.Context, string, string, int, string) (*pgCluster, error) {
	return nil, errors.New("outbox dev can start a private PostgreSQL only on Unix systems: set DATABASE_URL to a database you run")
}

func (c *pgCluster) URL() string             { return "" }
func (c *pgCluster) Stop()                   {}
func (c *pgCluster) Exited() <-chan struct{} { return nil }
func (c *pgCluster) PID() int                { return 0 }
