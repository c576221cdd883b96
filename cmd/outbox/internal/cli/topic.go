package cli

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/storedriver"
)

func newTopicCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topic",
		Short: "List topics, and pause or resume the delivery of one",
	}
	cmd.AddCommand(newTopicListCmd(g), newTopicPauseCmd(g), newTopicResumeCmd(g))
	return cmd
}

func newTopicPauseCmd(g *globals) *cobra.Command {
	var reason, by string
	cmd := &cobra.Command{
		Use:   "pause TOPIC",
		Short: "Hold a topic's messages until resume: none is handed to Temporal, and sends under way wait without using attempts",
		Example: `  outbox topic pause order.created --reason "billing API maintenance 14:00-16:00 UTC"
  outbox topic resume order.created`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			topic := args[0]
			if !store.TopicPattern.MatchString(topic) {
				return usageErrorf("topic must match %s, got %q", store.TopicPattern, topic)
			}
			// --by and --reason are checked before connecting, as flags are (the default
			// --by, the current user, is the store's to check).
			if err := storedriver.ValidatePause(topic, cmp.Or(by, "operator"), reason); err != nil {
				return usageErrorf("--by or --reason: %v", err)
			}
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				w := cmd.OutOrStdout()
				// Only a config that lists topics can say a topic is unknown: the operators'
				// commands often run with DATABASE_URL alone.
				if _, ok := a.Config.Topics[topic]; !ok && len(a.Config.Topics) > 0 && a.Config.Default == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: topic %q is not under topics: in the config and there is no default: entry; pausing it anyway\n", topic)
				}
				p, made, err := a.Driver.PauseTopic(cmd.Context(), topic, cmp.Or(by, currentUser(g.lookupEnv)), reason)
				if err != nil {
					return err
				}
				if !made {
					fmt.Fprintf(w, "%s was paused already, since %s by %s%s\n", p.Topic, p.PausedAt.Local().Format(time.DateTime), p.PausedBy, reasonSuffix(p.Reason))
					return nil
				}
				fmt.Fprintf(w, "paused %s%s\n", p.Topic, reasonSuffix(p.Reason))
				fmt.Fprintf(w, "Its messages wait: the relays hand none to Temporal, and a delivery already started waits without using attempts.\n")
				fmt.Fprintf(w, "outbox topic resume %s ends the pause.\n", p.Topic)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for whoever looks later (outbox topic list, outbox stats)")
	cmd.Flags().StringVar(&by, "by", "", "who pauses it (default: the current user)")
	return cmd
}

func newTopicResumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "resume TOPIC",
		Short: "End a topic's pause: its waiting messages are handed to Temporal again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			topic := args[0]
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				p, resumed, err := a.Driver.ResumeTopic(cmd.Context(), topic)
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if !resumed {
					fmt.Fprintf(w, "%s is not paused: nothing to resume\n", topic)
					return nil
				}
				fmt.Fprintf(w, "resumed %s, paused since %s by %s%s\n", p.Topic, p.PausedAt.Local().Format(time.DateTime), p.PausedBy, reasonSuffix(p.Reason))
				fmt.Fprintf(w, "Its waiting messages are handed over now; a delivery that was waiting sends within a minute.\n")
				return nil
			})
		},
	}
}

// topicView is one line of outbox topic list.
type topicView struct {
	Topic            string     `json:"topic"`
	Configured       bool       `json:"configured"`
	Paused           bool       `json:"paused"`
	PausedAt         *time.Time `json:"paused_at,omitempty"`
	PausedBy         string     `json:"paused_by,omitempty"`
	Reason           string     `json:"reason,omitempty"`
	Waiting          int64      `json:"waiting"`
	OldestAgeSeconds float64    `json:"oldest_waiting_age_seconds"`
}

func newTopicListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "The config's topics and every topic with waiting messages or a pause: paused or not, messages waiting for a relay, the oldest one's age",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				backlog, err := a.Driver.Backlog(cmd.Context())
				if err != nil {
					return err
				}
				paused, err := a.Driver.PausedTopics(cmd.Context())
				if err != nil {
					return err
				}
				views := map[string]*topicView{}
				view := func(topic string) *topicView {
					if views[topic] == nil {
						views[topic] = &topicView{Topic: topic}
					}
					return views[topic]
				}
				for topic := range a.Config.Topics {
					view(topic).Configured = true
				}
				for _, b := range backlog {
					v := view(b.Topic)
					v.Waiting, v.OldestAgeSeconds = b.Pending, b.OldestAge.Seconds()
				}
				for _, p := range paused {
					v := view(p.Topic)
					v.Paused, v.PausedAt, v.PausedBy, v.Reason = true, &p.PausedAt, p.PausedBy, p.Reason
				}
				out := make([]topicView, 0, len(views))
				for _, topic := range slices.Sorted(maps.Keys(views)) {
					out = append(out, *views[topic])
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), out)
				}
				if len(out) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no topics: none in the config, none with waiting messages")
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TOPIC\tSTATE\tWAITING\tOLDEST\tPAUSED SINCE\tBY\tREASON")
				for _, v := range out {
					state, since := "active", "-"
					if v.Paused {
						state, since = "paused", v.PausedAt.Local().Format(time.DateTime)
					}
					if !v.Configured && len(a.Config.Topics) > 0 {
						state += " (not in config)"
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", v.Topic, state, v.Waiting,
						age(time.Duration(v.OldestAgeSeconds*float64(time.Second))), since, cmp.Or(v.PausedBy, "-"), cmp.Or(truncate(v.Reason, 60), "-"))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// reasonSuffix is ": reason", or nothing for an empty reason.
func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}
