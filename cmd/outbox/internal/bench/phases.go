package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/workflows"
)

// phaseNames name the parts of one message's commit-to-sent time, in order, read from
// the database (created_at, sent_at) and its workflow's history.
var phaseNames = []string{
	"commit → run started",        // the relay's wait, claim and start
	"→ 1st workflow task started", // the task's dispatch to a worker (none with eager start)
	"→ sent_at",                   // the task: the local send and its recording of the row, or the task, the activity's dispatch and the send
}

// phases are the durations of phaseNames for one message.
type phases []time.Duration

// messagePhases reads the phases of the message whose row was created at created and
// recorded sent at sent.
func messagePhases(ctx context.Context, c client.Client, messageID string, created, sent time.Time) (phases, error) {
	var started, wft1Started time.Time
	it := c.GetWorkflowHistory(ctx, workflows.WorkflowID(messageID), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return nil, err
		}
		at := ev.GetEventTime().AsTime()
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			started = at
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
			if wft1Started.IsZero() {
				wft1Started = at
			}
		}
	}
	if started.IsZero() || wft1Started.IsZero() {
		return nil, fmt.Errorf("message %s: a history without a workflow task", messageID)
	}
	return phases{started.Sub(created), wft1Started.Sub(started), sent.Sub(wft1Started)}, nil
}

// printPhasesHeader prints the header of the phase table.
func printPhasesHeader(out io.Writer) {
	fmt.Fprintf(out, "| shape, offered rate | sampled | %s |\n|---|---:|%s\n", strings.Join(phaseNames, " | "), strings.Repeat("---:|", len(phaseNames)))
}

// printPhases prints the median of each phase over ps.
func printPhases(out io.Writer, label string, ps []phases) {
	cells := make([]string, len(phaseNames))
	for i := range phaseNames {
		ds := make([]time.Duration, len(ps))
		for j, p := range ps {
			ds[j] = p[i]
		}
		sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
		mid := ds[len(ds)/2]
		if len(ds)%2 == 0 {
			mid = (ds[len(ds)/2-1] + mid) / 2
		}
		cells[i] = ms(mid)
	}
	fmt.Fprintf(out, "| %s | %d | %s |\n", label, len(ps), strings.Join(cells, " | "))
}
