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
	"slices"
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

// filterFlags are the dead-letter filters of list, redrive and discard.
type filterFlags struct {
	topic     string
	since     string
	until     string
	errorText string
	limit     int
	all       bool
}

func (f *filterFlags) add(cmd *cobra.Command, limitDefault int) {
	cmd.Flags().StringVar(&f.topic, "topic", "", "only this topic")
	cmd.Flags().StringVar(&f.since, "since", "", "only dead letters since this long ago (1h, 30m) or this time (RFC 3339)")
	cmd.Flags().StringVar(&f.until, "until", "", "only dead letters before this long ago (1h, 30m) or this time (RFC 3339)")
	cmd.Flags().StringVar(&f.errorText, "error", "", "only dead letters whose last error contains this text (any case)")
	cmd.Flags().IntVar(&f.limit, "limit", limitDefault, "at most this many dead letters, the newest")
}

// set reports whether a filter that selects messages was given.
func (f *filterFlags) set() bool {
	return f.topic != "" || f.since != "" || f.until != "" || f.errorText != ""
}

func (f *filterFlags) filter(now time.Time) (store.DeadLetterFilter, error) {
	out := store.DeadLetterFilter{Topic: f.topic, Limit: f.limit, IncludeClosed: f.all, Error: f.errorText}
	if f.limit < 1 {
		return out, usageErrorf("--limit must be at least 1, got %d", f.limit)
	}
	var err error
	if out.Since, err = pointInTime("--since", f.since, now); err != nil {
		return out, err
	}
	if out.Until, err = pointInTime("--until", f.until, now); err != nil {
		return out, err
	}
	if !out.Since.IsZero() && !out.Until.IsZero() && !out.Since.Before(out.Until) {
		return out, usageErrorf("--since (%s) must be before --until (%s)", out.Since.Format(time.RFC3339), out.Until.Format(time.RFC3339))
	}
	return out, nil
}

// pointInTime reads flag's value v: a duration back from now, or an RFC 3339 time. Empty
// is the zero time.
func pointInTime(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.Time{}, usageErrorf("%s must be a duration such as 1h or a time such as 2026-11-30T09:00:00Z, got %q", flag, v)
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
				filter.Limit++ // one more tells that --limit cut the list
				dls, err := a.Driver.ListDeadLetters(cmd.Context(), filter)
				if err != nil {
					return err
				}
				if len(dls) > f.limit {
					dls = dls[:f.limit]
					fmt.Fprintf(cmd.ErrOrStderr(), "more dead letters match than --limit %d lets through: the %d newest are listed; raise --limit to see them all\n", f.limit, f.limit)
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), deadLettersJSON(dls))
				}
				if len(dls) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no dead letters")
					return nil
				}
				writeDeadLetterTable(cmd.OutOrStdout(), dls)
				return nil
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
				writeOrderingKey(w, row.OrderingKey, row.OrderingSeq)
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

// bulkFlags are what redrive and discard share: the messages (named, or chosen with a
// filter and --all-matching), --dry-run, the confirmation and who acts.
type bulkFlags struct {
	f           filterFlags
	allMatching bool
	dryRun      bool
	yes         bool
	confirmOver int
	by          string
}

func (b *bulkFlags) add(cmd *cobra.Command, verb string, confirmOver int) {
	b.f.add(cmd, 1000)
	cmd.Flags().BoolVar(&b.allMatching, "all-matching", false, verb+" every open dead letter the filter selects")
	cmd.Flags().BoolVar(&b.dryRun, "dry-run", false, "print how many dead letters would be "+pastTense(verb)+" and a sample, and change nothing")
	cmd.Flags().BoolVarP(&b.yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().IntVar(&b.confirmOver, "confirm-over", confirmOver, "ask for confirmation when more than this many messages are selected (0: always)")
	cmd.Flags().StringVar(&b.by, "by", "", "who "+verb+"s, for the audit (default: the current user)")
}

// pastTense is the participle of redrive and discard.
func pastTense(verb string) string {
	if verb == "redrive" {
		return "redriven"
	}
	return verb + "ed"
}

// sampleSize is how many selected dead letters --dry-run lists.
const sampleSize = 5

// selection is what a bulk command acts on: the messages' IDs, and, when a filter chose
// them, their dead letters and whether more matched than --limit let through.
type selection struct {
	ids     []uuid.UUID
	letters []store.DeadLetterRecord
	more    bool
}

// selectMessages returns the messages named on the command line, or those the filter
// matches when --all-matching is set.
func (b *bulkFlags) selectMessages(ctx context.Context, errOut io.Writer, a *app.App, args []string, verb string) (selection, error) {
	switch {
	case len(args) > 0 && (b.allMatching || b.f.set()):
		return selection{}, usageErrorf("give message IDs or a filter (--topic, --since, --until, --error with --all-matching), not both")
	case len(args) > 0:
		ids, err := parseIDs(args)
		if err != nil || !b.dryRun {
			return selection{ids: ids}, err
		}
		// A dry run counts and shows the named messages that have an open dead letter,
		// and names the others.
		var sel selection
		for _, id := range ids {
			dls, err := a.Driver.DeadLetters(ctx, id)
			if err != nil {
				return selection{}, err
			}
			i := slices.IndexFunc(dls, func(d store.DeadLetterRecord) bool { return d.RedrivenAt == nil && d.DiscardedAt == nil })
			if i < 0 {
				fmt.Fprintf(errOut, "would not %s %s: it has no open dead letter\n", verb, id)
				continue
			}
			sel.ids, sel.letters = append(sel.ids, id), append(sel.letters, dls[i])
		}
		return sel, nil
	case !b.allMatching:
		return selection{}, usageErrorf("name the messages to %s, or select them with --all-matching (and --topic, --since, --until, --error)", verb)
	}
	filter, err := b.f.filter(time.Now())
	if err != nil {
		return selection{}, err
	}
	filter.Limit++ // one more tells that --limit cut the selection
	dls, err := a.Driver.ListDeadLetters(ctx, filter)
	if err != nil {
		return selection{}, err
	}
	sel := selection{letters: dls}
	if len(dls) > b.f.limit {
		sel.letters, sel.more = dls[:b.f.limit], true
	}
	for _, d := range sel.letters {
		sel.ids = append(sel.ids, d.MessageID)
	}
	return sel, nil
}

// redrive redrives message id. When the filter selected it, it redrives it only while the
// dead letter the filter saw is still its open one: a message redriven and dead-lettered
// again (by someone else) while the command asked for confirmation is left alone, as the
// filter never saw its new letter. Messages named on the command line are acted on
// whatever their letter.
func (sel selection) redrive(ctx context.Context, a *app.App, id uuid.UUID, actor string) (store.Redriven, error) {
	letter, ok := sel.letter(id)
	if !ok {
		return a.Driver.Redrive(ctx, id, actor)
	}
	r, err := a.Driver.RedriveDeadLetter(ctx, id, letter, actor)
	return r, sel.explain(ctx, a, id, err)
}

// discard discards message id, as redrive redrives it.
func (sel selection) discard(ctx context.Context, a *app.App, id uuid.UUID, actor string) error {
	letter, ok := sel.letter(id)
	if !ok {
		return a.Driver.Discard(ctx, id, actor)
	}
	return sel.explain(ctx, a, id, a.Driver.DiscardDeadLetter(ctx, id, letter, actor))
}

// letter returns the ID of the dead letter the filter selected for message id.
func (sel selection) letter(id uuid.UUID) (int64, bool) {
	i := slices.IndexFunc(sel.letters, func(d store.DeadLetterRecord) bool { return d.MessageID == id })
	if i < 0 {
		return 0, false
	}
	return sel.letters[i].ID, true
}

// explain turns the store's report that a selected dead letter is no longer open into
// what the operator needs to decide again: the message's open letter now, if any.
func (sel selection) explain(ctx context.Context, a *app.App, id uuid.UUID, err error) error {
	var changed *store.DeadLetterChangedError
	if !errors.As(err, &changed) {
		return err
	}
	dls, lerr := a.Driver.DeadLetters(ctx, id)
	if lerr != nil {
		return err
	}
	for _, d := range slices.Backward(dls) {
		if d.RedrivenAt == nil && d.DiscardedAt == nil {
			return fmt.Errorf("%s: its dead letter changed since the selection (now %q, dead-lettered %s): select again",
				id, truncate(d.LastError, 80), d.DeadLetteredAt.Format(time.RFC3339))
		}
	}
	return fmt.Errorf("%s: its dead letter changed since the selection (it has no open dead letter now): select again", id)
}

// confirm prints a dry run's count and sample, or asks before acting on the selection when
// it holds more than --confirm-over messages (and --yes is not given). It reports whether
// to go on.
func (b *bulkFlags) confirm(cmd *cobra.Command, sel selection, verb, warning string) (bool, error) {
	w := cmd.OutOrStdout()
	n := len(sel.ids)
	if n == 0 {
		fmt.Fprintln(w, "no dead letters match")
		return false, nil
	}
	if sel.more {
		fmt.Fprintf(cmd.ErrOrStderr(), "more dead letters match than --limit %d lets through: the %d newest are selected; run again, or raise --limit\n", b.f.limit, n)
	}
	if b.dryRun {
		fmt.Fprintf(w, "would %s %d dead-lettered message(s)%s\n", verb, n, byTopic(sel.letters))
		if len(sel.letters) > 0 {
			shown := sel.letters[:min(len(sel.letters), sampleSize)]
			fmt.Fprintf(w, "the newest %d:\n", len(shown))
			writeDeadLetterTable(w, shown)
		}
		return false, nil
	}
	if b.yes || n <= b.confirmOver {
		return true, nil
	}
	fmt.Fprintf(w, "%s %d dead-lettered message(s)?%s [y/N] ", capitalize(verb), n, warning)
	answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		return false, fmt.Errorf("not %s: not confirmed (answer y, or pass --yes)", pastTense(verb))
	}
	return true, nil
}

func capitalize(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

// byTopic counts dead letters by topic: " (order.created: 3, order.paid: 1)".
func byTopic(dls []store.DeadLetterRecord) string {
	if len(dls) == 0 {
		return ""
	}
	counts := map[string]int{}
	var topics []string
	for _, d := range dls {
		if counts[d.Topic] == 0 {
			topics = append(topics, d.Topic)
		}
		counts[d.Topic]++
	}
	slices.Sort(topics)
	parts := make([]string, 0, len(topics))
	for _, t := range topics {
		parts = append(parts, fmt.Sprintf("%s: %d", t, counts[t]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// writeDeadLetterTable writes dead letters as dlq list does.
func writeDeadLetterTable(w io.Writer, dls []store.DeadLetterRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MESSAGE ID\tTOPIC\tATTEMPTS\tDEAD-LETTERED\tSTATE\tLAST ERROR")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", d.MessageID, d.Topic, d.Attempts,
			d.DeadLetteredAt.Local().Format(time.DateTime), state(d), truncate(d.LastError, 80))
	}
	_ = tw.Flush()
}

func newDLQRedriveCmd(g *globals) *cobra.Command {
	var b bulkFlags
	cmd := &cobra.Command{
		Use:   "redrive [MESSAGE_ID...]",
		Short: "Deliver dead-lettered messages again, as a new run under the same workflow ID",
		Example: `  outbox dlq redrive 01a22bd4-e1d1-7a2a-9e3e-c3f8ce034627
  outbox dlq redrive --all-matching --topic order.created --since 2h
  outbox dlq redrive --all-matching --error 'HTTP 503' --since 2026-12-01T09:00:00Z --until 2026-12-01T11:00:00Z --dry-run`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				sel, err := b.selectMessages(cmd.Context(), cmd.ErrOrStderr(), a, args, "redrive")
				if err != nil {
					return err
				}
				if ok, err := b.confirm(cmd, sel, "redrive", ""); !ok || err != nil {
					return err
				}
				actor := cmp.Or(b.by, currentUser(g.lookupEnv))
				var failed []error
				for _, id := range sel.ids {
					r, err := sel.redrive(cmd.Context(), a, id, actor)
					if err != nil {
						failed = append(failed, err)
						fmt.Fprintf(cmd.ErrOrStderr(), "not redriven: %v\n", err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "redriven %s (%s, redrive %d)\n", r.MessageID, r.Topic, r.RedriveCount)
				}
				if len(failed) > 0 {
					return fmt.Errorf("%d of %d messages not redriven", len(failed), len(sel.ids))
				}
				return nil
			})
		},
	}
	b.add(cmd, "redrive", 10)
	return cmd
}

func newDLQDiscardCmd(g *globals) *cobra.Command {
	var b bulkFlags
	cmd := &cobra.Command{
		Use:   "discard [MESSAGE_ID...]",
		Short: "Give up on dead-lettered messages (asks first unless --yes)",
		Example: `  outbox dlq discard 01a22bd4-e1d1-7a2a-9e3e-c3f8ce034627
  outbox dlq discard --all-matching --topic order.created --error 'HTTP 422' --until 24h --dry-run`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withApp(cmd.Context(), false, func(a *app.App) error {
				sel, err := b.selectMessages(cmd.Context(), cmd.ErrOrStderr(), a, args, "discard")
				if err != nil {
					return err
				}
				if ok, err := b.confirm(cmd, sel, "discard", " They will not be delivered."); !ok || err != nil {
					return err
				}
				actor := cmp.Or(b.by, currentUser(g.lookupEnv))
				var failed int
				for _, id := range sel.ids {
					if err := sel.discard(cmd.Context(), a, id, actor); err != nil {
						failed++
						fmt.Fprintf(cmd.ErrOrStderr(), "not discarded: %v\n", err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "discarded %s\n", id)
				}
				if failed > 0 {
					return fmt.Errorf("%d of %d messages not discarded", failed, len(sel.ids))
				}
				return nil
			})
		},
	}
	// A discard is final: it asks whatever the count.
	b.add(cmd, "discard", 0)
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
