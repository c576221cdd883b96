//go:build !nodev

package main

import (
	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/cmd/outbox/internal/bench"
	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/cmd/outbox/internal/dev"
)

// devCommands are the commands that run a Temporal server beside the outbox.
var devCommands = []func(*cli.Env) *cobra.Command{dev.Command, bench.Command}
