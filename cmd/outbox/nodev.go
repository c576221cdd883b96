//go:build nodev

package main

import (
	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
)

// devCommands is empty: a nodev build contains no Temporal server.
var devCommands []func(*cli.Env) *cobra.Command
