package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/store"
)

func newRetentionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "retention",
		Short: "Remove old sent and discarded messages (the outbox-retention schedule, or now)",
		Long: `Retention removes sent messages older than retention.sent_after, and discarded
messages with their dead letters older than retention.discarded_after, in batches of
retention.batch_size rows, each its own short transaction. With retention.archive: true
the rows move to outbox_messages_archive and outbox_dead_letters_archive instead.

With retention.enabled: true the worker runs it as the Temporal Schedule outbox-retention
(outbox-retention-<task queue> for a task queue other than outbox) every
retention.interval; pause it in the Temporal UI. "retention run" runs it now, without
Temporal.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newRetentionRunCmd(g))
	return cmd
}

func newRetentionRunCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Remove old rows now, batch by batch, with the config's retention settings",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				r := a.Config.Retention
				total, err := a.Driver.Purge(cmd.Context(), r.PurgeOptions())
				if total.Batches > 0 || err == nil {
					// What was removed before an error or an interrupt is gone all the same.
					if werr := printPurge(cmd, total, r.Archive, asJSON); werr != nil && err == nil {
						err = werr
					}
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printPurge(cmd *cobra.Command, total store.PurgeResult, archive, asJSON bool) error {
	if asJSON {
		return writeJSON(cmd.OutOrStdout(), map[string]any{
			"archive":            archive,
			"sent_messages":      total.SentMessages,
			"discarded_messages": total.DiscardedMessages,
			"dead_letters":       total.DeadLetters,
			"batches":            total.Batches,
		})
	}
	verb := "deleted"
	if archive {
		verb = "archived"
	}
	batches := "batches"
	if total.Batches == 1 {
		batches = "batch"
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %d sent messages, %d discarded messages, %d dead letters (%d %s)\n",
		verb, total.SentMessages, total.DiscardedMessages, total.DeadLetters, total.Batches, batches)
	return err
}
