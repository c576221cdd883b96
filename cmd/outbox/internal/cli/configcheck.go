package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
)

// newConfigCmd is outbox config: check a file, or compare the files of a relay and a
// worker.
func newConfigCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Check configuration files"}
	check := &cobra.Command{
		Use:   "check [FILE...]",
		Short: "Validate config files (default: --config), and report where two of them disagree",
		Long: `check loads each file as outbox relay and outbox worker would (the environment
applied), validates it, and prints "ok". Given two or more files, such as the relay's
and the worker's, it also reports each topic they would deliver differently: its
delivery policy (the relay freezes it into each run it starts), its ordering settings,
or who delivers it (a sink of the worker and its kind, a team's activity or workflow, or
nothing). Sink settings and secrets may differ between processes and are not compared.
It exits 78 when a file is invalid or two files disagree, and connects to nothing.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{g.configPath}
			}
			var cfgs []*config.Config
			for _, path := range args {
				cfg, err := config.LoadEnv(path, g.lookupEnv)
				if err != nil {
					return &app.ConfigError{Err: err}
				}
				d := cfg.WithDefaults()
				if err := d.Validate(); err != nil {
					return &app.ConfigError{Err: fmt.Errorf("%s: %w", displayPath(path), err)}
				}
				fmt.Fprintf(g.stdout, "%s: ok\n", displayPath(path))
				cfgs = append(cfgs, &d)
			}
			var errs []error
			for i := 1; i < len(cfgs); i++ {
				for _, d := range config.Compare(cfgs[0], cfgs[i]) {
					errs = append(errs, fmt.Errorf("%s and %s: %s", displayPath(args[0]), displayPath(args[i]), d))
				}
			}
			if len(errs) > 0 {
				return &app.ConfigError{Err: errors.Join(errs...)}
			}
			if len(cfgs) > 1 {
				fmt.Fprintln(g.stdout, "the files agree on every topic's policy, ordering and handler")
			}
			return nil
		},
	}
	cmd.AddCommand(check)
	return cmd
}

// displayPath names a config file; the empty path is the built-in configuration.
func displayPath(path string) string {
	if path == "" {
		return "(no file: defaults and environment)"
	}
	return path
}
