package cli

import (
	"errors"
	"fmt"
	"time"

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
delivery policy (the relays freeze the policies of the file changed last into the runs
they start, whichever process read it: the report names that file), its ordering
settings, or who delivers it (a sink of the worker and its kind, a team's activity or
workflow, or nothing). Sink settings and secrets may differ between processes and are
not compared.
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
			policies := false
			for i := 1; i < len(cfgs); i++ {
				for _, d := range config.Compare(cfgs[0], cfgs[i]) {
					errs = append(errs, fmt.Errorf("%s and %s: %s", displayPath(args[0]), displayPath(args[i]), d))
					policies = policies || d.What == "policy"
				}
			}
			if policies {
				errs = append(errs, inEffect(args, cfgs))
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

// inEffect says which file's delivery policies the relays follow once processes of every
// file have started: the one changed last (see config.Config.PolicyAsOf).
func inEffect(paths []string, cfgs []*config.Config) error {
	newest := -1
	for i, c := range cfgs {
		if !c.PolicyAsOf.IsZero() && (newest < 0 || !c.PolicyAsOf.Before(cfgs[newest].PolicyAsOf)) {
			newest = i
		}
	}
	if newest < 0 {
		return errors.New("none of the files is dated, so each relay freezes its own file's policies")
	}
	return fmt.Errorf("once processes of these files have started, every relay follows the policies of %s, changed last (%s)",
		displayPath(paths[newest]), cfgs[newest].PolicyAsOf.UTC().Format(time.RFC3339))
}

// displayPath names a config file; the empty path is the built-in configuration.
func displayPath(path string) string {
	if path == "" {
		return "(no file: defaults and environment)"
	}
	return path
}
