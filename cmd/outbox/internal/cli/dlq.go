package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/store"
)

func newDLQCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, redrive and discard dead-lettered messages",
	}
	cmd.AddCommand(newDLQListCmd(g), newDLQShowCmd(g), newDLQRedriveCmd(g), newDLQDiscardCmd(g))
	return cmd
}

// filterFlags are the dead-letter filters of list and redrive.
type filterFlags struct {
	topic string
	since string
	limit int
	all   bool
}

func (f *filterFlags) add(cmd *cobra.Command, limitDefault int) {
	cmd.Flags().StringVar(&f.topic, "topic", "", "only this topic")
	cmd.Flags().StringVar(&f.since, "since", "", "only dead letters since this long ago (1h, 30m) or this time (RFC 3339)")
	cmd.Flags().IntVar(&f.limit, "limit", limitDefault, "at most this many dead letters")
}

func (f *filterFlags) filter(now time.Time) (store.DeadLetterFilter, error) {
	out := store.DeadLetterFilter{Topic: f.topic, Limit: f.limit, IncludeClosed: f.all}
	if f.limit < 1 {
		return out, usageErrorf("--limit must be at least 1, got %d", f.limit)
	}
	if f.since != "" {
		if d, err := time.ParseDuration(f.since); err == nil && d > 0 {
			out.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339, f.since); err == nil {
			out.Since = t
		} else {
			return out, usageErrorf("--since must be a duration such as 1h or a time such as 2026-11-30T09:00:00Z, got %q", f.since)
		}
	}
	return out, nil
}

func newDLQListCmd(g *globals) *cobra.Command {
	var (
		f      filterFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, newest first (open ones: not redriven or discarded)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := f.filter(time.Now())
			if err != nil {
				return err
			}
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				dls, err := a.Driver.ListDeadLetters(cmd.Context(), filter)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), deadLettersJSON(dls))
				}
				if len(dls) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no dead letters")
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "MESSAGE ID\tTOPIC\tATTEMPTS\tDEAD-LETTERED\tSTATE\tLAST ERROR")
				for _, d := range dls {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", d.MessageID, d.Topic, d.Attempts,
						d.DeadLetteredAt.Local().Format(time.DateTime), state(d), truncate(d.LastError, 80))
				}
				return tw.Flush()
			})
		},
	}
	f.add(cmd, 50)
	cmd.Flags().BoolVar(&f.all, "all", false, "also list dead letters already redriven or discarded")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// state is a dead letter's state: open, redriven or discarded.
func state(d store.DeadLetterRecord) string { return deadLetterState(d.RedrivenAt, d.DiscardedAt) }

func deadLetterState(redrivenAt, discardedAt *time.Time) string {
	switch {
	case redrivenAt != nil:
		return "redriven"
	case discardedAt != nil:
		return "discarded"
	default:
		return "open"
	}
}

func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

type deadLetterJSON struct {
	ID             int64           `json:"id"`
	MessageID      uuid.UUID       `json:"message_id"`
	Topic          string          `json:"topic"`
	WorkflowID     string          `json:"workflow_id"`
	RunID          string          `json:"run_id"`
	Attempts       int             `json:"attempts"`
	LastError      string          `json:"last_error"`
	Payload        json.RawMessage `json:"payload"`
	DeadLetteredAt time.Time       `json:"dead_lettered_at"`
	RedrivenAt     *time.Time      `json:"redriven_at,omitempty"`
	RedrivenBy     *string         `json:"redriven_by,omitempty"`
	DiscardedAt    *time.Time      `json:"discarded_at,omitempty"`
	DiscardedBy    *string         `json:"discarded_by,omitempty"`
	URL            string          `json:"url,omitempty"`
}

func deadLettersJSON(dls []store.DeadLetterRecord) []deadLetterJSON {
	out := make([]deadLetterJSON, 0, len(dls))
	for _, d := range dls {
		out = append(out, deadLetterJSON{
			ID: d.ID, MessageID: d.MessageID, Topic: d.Topic, WorkflowID: d.WorkflowID, RunID: d.RunID,
			Attempts: d.Attempts, LastError: d.LastError, Payload: d.Payload, DeadLetteredAt: d.DeadLetteredAt,
			RedrivenAt: d.RedrivenAt, RedrivenBy: d.RedrivenBy, DiscardedAt: d.DiscardedAt, DiscardedBy: d.DiscardedBy,
		})
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// workflowURL links a run's history in the Temporal Web UI.
// A user or query in ui_url (a proxy's credentials) is left out: the link is printed.
func workflowURL(a *app.App, workflowID, runID string) string {
	base := redact.URL(a.Config.UIURL)
	if u, err := url.Parse(a.Config.UIURL); err == nil && u.User == nil && !strings.Contains(a.Config.UIURL, "@") {
		u.RawQuery, u.Fragment = "", ""
		base = u.String() // with its path, for a UI behind a path prefix
	}
	workflow := fmt.Sprintf("%s/namespaces/%s/workflows/%s", strings.TrimRight(base, "/"),
		url.PathEscape(a.Config.Temporal.Namespace), url.PathEscape(workflowID))
	if runID == "" {
		return workflow // its latest run
	}
	return workflow + "/" + url.PathEscape(runID) + "/history"
}

func parseIDs(args []string) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, len(args))
	for _, s := range args {
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, usageErrorf("message ID must be a UUID, got %q", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func newDLQShowCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show MESSAGE_ID",
		Short: "Show a dead-lettered message: payload, attempts, last error, history and a link to its workflow",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				ctx := cmd.Context()
				row, err := a.Driver.Get(ctx, ids[0])
				if err != nil {
					return err
				}
				dls, err := a.Driver.DeadLetters(ctx, ids[0])
				if err != nil {
					return err
				}
				audit, err := a.Driver.Audit(ctx, ids[0])
				if err != nil {
					return err
				}
				views := deadLettersJSON(dls)
				for i := range views {
					views[i].URL = workflowURL(a, views[i].WorkflowID, views[i].RunID)
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), map[string]any{
						"message_id": row.MessageID, "topic": row.Topic, "status": row.Status, "payload": row.Payload,
						"headers": row.Headers, "retry_times": row.RetryTimes, "max_retry_times": row.MaxRetryTimes,
						"last_error": row.LastError, "redrive_count": row.RedriveCount, "created_at": row.CreatedAt,
						"ordering_key": row.OrderingKey, "ordering_seq": row.OrderingSeq,
						"dead_letters": views, "audit": audit,
					})
				}
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "Message      %s\nTopic        %s\nStatus       %s\nCreated      %s\nRedrives     %d\n",
					row.MessageID, row.Topic, row.Status, row.CreatedAt.Local().Format(time.DateTime), row.RedriveCount)
				if row.OrderingKey != nil {
					fmt.Fprintf(w, "Ordering key %s (message %d of the key)\n", *row.OrderingKey, *row.OrderingSeq)
				}
				if row.LastError != nil {
					fmt.Fprintf(w, "Last error   %s\n", *row.LastError)
				}
				writePayload(w, row.Payload)
				if len(views) == 0 {
					fmt.Fprintln(w, "\nNo dead letters.")
				}
				writeDeadLetters(w, views, time.DateTime)
				writeAudit(w, audit, time.DateTime)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func currentUser(lookup func(string) (string, bool)) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if v, ok := lookup("USER"); ok && v != "" {
		return v
	}
	return "unknown"
}

// selectMessages returns the IDs named on the command line, or those the filter matches
// when allMatching is set.
func selectMessages(ctx context.Context, a *app.App, args []string, f filterFlags, allMatching bool, verb string) ([]uuid.UUID, error) {
	switch {
	case len(args) > 0 && (allMatching || f.topic != "" || f.since != ""):
		return nil, fmt.Errorf("give message IDs or a filter (--topic, --since with --all-matching), not both")
	case len(args) > 0:
		return parseIDs(args)
	case !allMatching:
		return nil, fmt.Errorf("name the messages to %s, or select them with --all-matching (and --topic, --since)", verb)
	}
	filter, err := f.filter(time.Now())
	if err != nil {
		return nil, err
	}
	dls, err := a.Driver.ListDeadLetters(ctx, filter)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, 0, len(dls))
	for _, d := range dls {
		ids = append(ids, d.MessageID)
	}
	return ids, nil
}

func newDLQRedriveCmd(g *globals) *cobra.Command {
	var (
		f           filterFlags
		allMatching bool
		by          string
	)
	cmd := &cobra.Command{
		Use:   "redrive [MESSAGE_ID...]",
		Short: "Deliver dead-lettered messages again, as a new run under the same workflow ID",
		Example: `  outbox dlq redrive 01a22bd4-e1d1-7a2a-9e3e-c3f8ce034627
  outbox dlq redrive --all-matching --topic order.created --since 2h`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				ids, err := selectMessages(cmd.Context(), a, args, f, allMatching, "redrive")
				if err != nil {
					return err
				}
				actor := cmp.Or(by, currentUser(g.lookupEnv))
				var failed []error
				for _, id := range ids {
					r, err := a.Driver.Redrive(cmd.Context(), id, actor)
					if err != nil {
						failed = append(failed, err)
						fmt.Fprintf(cmd.ErrOrStderr(), "not redriven: %v\n", err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "redriven %s (%s, redrive %d)\n", r.MessageID, r.Topic, r.RedriveCount)
				}
				if len(ids) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no dead letters match")
				}
				if len(failed) > 0 {
					return fmt.Errorf("%d of %d messages not redriven", len(failed), len(ids))
				}
				return nil
			})
		},
	}
	f.add(cmd, 1000)
	cmd.Flags().BoolVar(&allMatching, "all-matching", false, "redrive every open dead letter the filter selects")
	cmd.Flags().StringVar(&by, "by", "", "who redrives, for the audit (default: the current user)")
	return cmd
}

func newDLQDiscardCmd(g *globals) *cobra.Command {
	var (
		f           filterFlags
		allMatching bool
		by          string
		yes         bool
	)
	cmd := &cobra.Command{
		Use:   "discard [MESSAGE_ID...]",
		Short: "Give up on dead-lettered messages (asks first unless --yes)",
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				ids, err := selectMessages(cmd.Context(), a, args, f, allMatching, "discard")
				if err != nil {
					return err
				}
				if len(ids) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no dead letters match")
					return nil
				}
				if !yes {
					fmt.Fprintf(cmd.OutOrStdout(), "Discard %d dead-lettered message(s)? They will not be delivered. [y/N] ", len(ids))
					answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
					if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
						return errors.New("not discarded: not confirmed (answer y, or pass --yes)")
					}
				}
				actor := cmp.Or(by, currentUser(g.lookupEnv))
				var failed int
				for _, id := range ids {
					if err := a.Driver.Discard(cmd.Context(), id, actor); err != nil {
						failed++
						fmt.Fprintf(cmd.ErrOrStderr(), "not discarded: %v\n", err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "discarded %s\n", id)
				}
				if failed > 0 {
					return fmt.Errorf("%d of %d messages not discarded", failed, len(ids))
				}
				return nil
			})
		},
	}
	f.add(cmd, 1000)
	cmd.Flags().BoolVar(&allMatching, "all-matching", false, "discard every open dead letter the filter selects")
	cmd.Flags().StringVar(&by, "by", "", "who discards, for the audit (default: the current user)")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// writePayload writes a message's payload, indented when it is JSON.
func writePayload(w io.Writer, payload []byte) {
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, payload, "  ", "  "); err != nil {
		pretty.Reset()
		pretty.Write(payload)
	}
	fmt.Fprintf(w, "Payload\n  %s\n", pretty.String())
}

// writeDeadLetters writes a message's dead letters, times in layout.
func writeDeadLetters(w io.Writer, views []deadLetterJSON, layout string) {
	for i, d := range views {
		fmt.Fprintf(w, "\nDead letter %d of %d (%s)\n  Dead-lettered  %s after %d attempts\n  Last error     %s\n  Workflow       %s\n",
			i+1, len(views), d.state(), d.DeadLetteredAt.Local().Format(layout), d.Attempts, d.LastError, d.URL)
	}
}

// writeAudit writes the operator actions on a message, times in layout.
func writeAudit(w io.Writer, audit []store.AuditEntry, layout string) {
	if len(audit) == 0 {
		return
	}
	fmt.Fprintln(w, "\nAudit")
	for _, e := range audit {
		line := fmt.Sprintf("  %s  %-9s by %s", e.At.Local().Format(layout), e.Action, e.Actor)
		if e.Detail != nil {
			line += ": " + *e.Detail
		}
		fmt.Fprintln(w, line)
	}
}

// state is the dead letter's state: open, redriven or discarded.
func (d deadLetterJSON) state() string { return deadLetterState(d.RedrivenAt, d.DiscardedAt) }
