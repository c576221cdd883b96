package cli

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

func newStatsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Counts by status and topic, the oldest pending message's age, messages in flight and recent dead letters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				s, err := a.Driver.Stats(cmd.Context())
				if err != nil {
					return err
				}
				// A schema before migration 0014 has no policies to show; the rest is shown.
				policies, policiesErr := a.Driver.PublishedPolicy(cmd.Context())
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), map[string]any{
						"by_status": s.ByStatus, "by_topic": s.ByTopic,
						"oldest_pending_age_seconds":   s.OldestPendingAge.Seconds(),
						"in_flight":                    s.InFlight,
						"oldest_in_flight_age_seconds": s.OldestInFlightAge.Seconds(),
						"open_dead_letters":            s.OpenDeadLetters,
						"dead_letters_last_hour":       s.DeadLettersLastHour,
						"dead_letters_last_day":        s.DeadLettersLastDay,
						"held_back":                    s.HeldBack,
						"keys_blocked_by_dead":         s.KeysBlockedByDead,
						"repaired_last_day":            s.RepairedLastDay,
						"paused_topics":                append([]store.TopicPause{}, s.Paused...),
						"policies":                     policiesJSON(policies),
						"at":                           s.At,
					})
				}
				w := cmd.OutOrStdout()
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
				fmt.Fprint(tw, "TOPIC\t")
				for _, st := range store.Statuses {
					fmt.Fprintf(tw, "%s\t", st)
				}
				fmt.Fprintln(tw)
				topics := make([]string, 0, len(s.ByTopic))
				for t := range s.ByTopic {
					topics = append(topics, t)
				}
				sort.Strings(topics)
				for _, t := range topics {
					fmt.Fprintf(tw, "%s\t", t)
					for _, st := range store.Statuses {
						fmt.Fprintf(tw, "%d\t", s.ByTopic[t][st])
					}
					fmt.Fprintln(tw)
				}
				fmt.Fprint(tw, "all\t")
				for _, st := range store.Statuses {
					fmt.Fprintf(tw, "%d\t", s.ByStatus[st])
				}
				fmt.Fprintln(tw)
				if err := tw.Flush(); err != nil {
					return err
				}
				fmt.Fprintf(w, "\nOldest pending   %s\n", age(s.OldestPendingAge))
				fmt.Fprintf(w, "In flight        %d (claimed, or handed to Temporal and not finished), oldest handed over %s\n", s.InFlight, age(s.OldestInFlightAge))
				fmt.Fprintf(w, "Dead letters     %d open, %d in the last hour, %d in the last day\n",
					s.OpenDeadLetters, s.DeadLettersLastHour, s.DeadLettersLastDay)
				fmt.Fprintf(w, "Ordering keys    %d messages held back behind an earlier one of their key; %d keys blocked by a dead message\n",
					s.HeldBack, s.KeysBlockedByDead)
				fmt.Fprintf(w, "Reconciliation   %d rows repaired in the last day\n", s.RepairedLastDay)
				if policiesErr != nil {
					fmt.Fprintf(w, "Policies         unknown: %v\n", policiesErr)
				} else {
					fmt.Fprintf(w, "Policies         %s\n", policiesLine(policies, a.Config))
				}
				fmt.Fprint(w, "Paused topics    ")
				if len(s.Paused) == 0 {
					fmt.Fprintln(w, "none")
				}
				for i, p := range s.Paused {
					if i > 0 {
						fmt.Fprint(w, "                 ")
					}
					fmt.Fprintf(w, "%s since %s by %s%s\n", p.Topic, p.PausedAt.Local().Format(time.DateTime), p.PausedBy, reasonSuffix(p.Reason))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func age(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.Round(time.Second).String() + " ago"
}

// policiesLine says whose delivery policies the relays follow and, when the command's own
// config is dated, whether its file's differ.
func policiesLine(p store.PublishedPolicy, c config.Config) string {
	if p.Policies == nil {
		return "none published: each relay freezes its own configuration's policies"
	}
	line := fmt.Sprintf("from %s, changed %s", p.By, p.AsOf.Local().Format(time.DateTime))
	if c.PolicyAsOf.IsZero() {
		return line
	}
	var in workflows.Policies
	if err := json.Unmarshal(p.Policies, &in); err != nil {
		return line + " (unreadable here: " + err.Error() + ")"
	}
	if differ := c.Policies().Differ(in); len(differ) > 0 {
		return line + "; " + displayPath(c.Path) + " differs for " + strings.Join(differ, ", ")
	}
	return line + "; " + displayPath(c.Path) + " agrees"
}

// policiesJSON is the published policies' publication, for --json; nil when none.
func policiesJSON(p store.PublishedPolicy) any {
	if p.Policies == nil {
		return nil
	}
	return map[string]any{"by": p.By, "as_of": p.AsOf, "published_at": p.PublishedAt, "policies": p.Policies}
}
