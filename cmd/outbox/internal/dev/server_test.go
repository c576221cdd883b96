package dev

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
)

func TestResolveServer(t *testing.T) {
	found := func(string) (string, error) { return "/usr/local/bin/temporal", nil }
	missing := func(string) (string, error) {
		return "", errors.New(`exec: "temporal": executable file not found in $PATH`)
	}
	pg := TemporalOptions{PostgresURL: "postgres://postgres@127.0.0.1:5432/temporal"}
	for _, tc := range []struct {
		name     string
		mode     string
		o        TemporalOptions
		lookPath func(string) (string, error)
		want     string
		err      string
	}{
		{"AutoWithCLI", ServerAuto, TemporalOptions{}, found, ServerCLI, ""},
		{"AutoWithoutCLI", ServerAuto, TemporalOptions{}, missing, ServerBuiltin, ""},
		{"AutoOnPostgres", ServerAuto, pg, found, ServerBuiltin, ""},
		{"CLI", ServerCLI, TemporalOptions{}, found, ServerCLI, ""},
		{"CLIMissing", ServerCLI, TemporalOptions{}, missing, "", "--temporal-server cli: no temporal command on PATH"},
		{"CLIOnPostgres", ServerCLI, pg, found, "", "--temporal-server cli and --temporal-postgres"},
		{"Builtin", ServerBuiltin, TemporalOptions{}, found, ServerBuiltin, ""},
		{"Unknown", "docker", TemporalOptions{}, found, "", `--temporal-server must be auto, cli or builtin, got "docker"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveServer(tc.mode, tc.o, tc.lookPath)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ResolveServer(%q) = %q, %v; want an error containing %q", tc.mode, got, err, tc.err)
				}
				if tc.name == "Unknown" && cli.ExitCode(err) != cli.ExitUsage {
					t.Fatalf("a --temporal-server value outside those allowed exits %d, want %d (usage)", cli.ExitCode(err), cli.ExitUsage)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ResolveServer(%q) = %q, %v; want %q", tc.mode, got, err, tc.want)
			}
		})
	}
}

// TestCLIArgs checks the development server's command line: the outbox's search attributes
// registered at start, the UI off when its port is 0, the state file when there is one.
func TestCLIArgs(t *testing.T) {
	o := TemporalOptions{FrontendPort: 7300, UIPort: 0, DatabaseFile: "/d/temporal-cli.db"}
	o.WithDefaults()
	args := strings.Join(cliArgs(o), " ")
	for _, want := range []string{"server start-dev", "--port 7300", "--headless", "--db-filename /d/temporal-cli.db",
		"--namespace default", "--search-attribute OutboxTopic=Keyword"} {
		if !strings.Contains(args, want) {
			t.Errorf("temporal %s: missing %q", args, want)
		}
	}
	o.UIPort = 8300
	if args := strings.Join(cliArgs(o), " "); !strings.Contains(args, "--ui-port 8300") || strings.Contains(args, "--headless") {
		t.Errorf("temporal %s: want --ui-port 8300 and no --headless", args)
	}
}
