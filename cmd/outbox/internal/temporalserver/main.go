// Command temporalserver is the built-in Temporal server of outbox dev and outbox bench: the
// Temporal server and its Web UI in one process, the state in a SQLite file (or PostgreSQL
// with --temporal-postgres), the namespace and the outbox's search attributes created at
// start. outbox dev builds it on first use when no Temporal CLI is installed, and runs it as
// a child process, so the outbox binary itself does not link the server:
//
//	go build -o outbox-temporal ./cmd/outbox/internal/temporalserver
//	outbox-temporal --port 7233 --ui-port 8233 --db-file temporal.db
//
// It runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/outbox-go/outbox/cmd/outbox/internal/dev"
	"github.com/outbox-go/outbox/cmd/outbox/internal/devserver"
)

func main() {
	var o dev.TemporalOptions
	f := pflag.NewFlagSet("outbox-temporal", pflag.ContinueOnError)
	o.AddFlags(f)
	f.StringVar(&o.DatabaseFile, "db-file", "", "SQLite file of the state (default: a throwaway file, removed at exit)")
	f.StringVar(&o.LogFile, "log-file", "", "file for the server's warnings and errors (default: standard error)")
	f.DurationVar(&o.Retention, "retention", 7*24*time.Hour, "retention of closed workflows in the namespace it creates")
	readyFile := f.String("ready-file", "", "file to create once the server and its UI serve and the namespace is usable")
	if err := f.Parse(os.Args[1:]); err != nil {
		os.Exit(64)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ts, err := devserver.Start(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-temporal:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "outbox-temporal: frontend %s ready\n", ts.Address())
	if *readyFile != "" {
		if err := os.WriteFile(*readyFile, []byte(ts.Address()+"\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "outbox-temporal:", err)
			ts.Stop()
			os.Exit(1)
		}
	}
	<-ctx.Done()
	ts.Stop()
}
