package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/workflows"
)

// phases are where one message's commit-to-sent time went, read from the database and
// its workflow's history.
type phases struct {
	pickup   time.Duration // commit to WorkflowExecutionStarted: the relay's wait, claim and start
	toSend   time.Duration // workflow start to the send activity's start: the first workflow task
	send     time.Duration // the send activity, started to completed
	toRecord time.Duration // send completed to sent_at: the second workflow task and mark-sent
}

// messagePhases reads the phases of the message whose row was created at created and
// recorded sent at sent.
func messagePhases(ctx context.Context, c client.Client, messageID string, created, sent time.Time) (phases, error) {
	var started, sendStarted, sendDone time.Time
	it := c.GetWorkflowHistory(ctx, workflows.WorkflowID(messageID), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return phases{}, err
		}
		at := ev.GetEventTime().AsTime()
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			started = at
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			if sendStarted.IsZero() {
				sendStarted = at
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
			if sendDone.IsZero() {
				sendDone = at
			}
		}
	}
	if started.IsZero() || sendStarted.IsZero() || sendDone.IsZero() {
		return phases{}, fmt.Errorf("message %s: history without a completed send", messageID)
	}
	return phases{
		pickup:   started.Sub(created),
		toSend:   sendStarted.Sub(started),
		send:     sendDone.Sub(sendStarted),
		toRecord: sent.Sub(sendDone),
	}, nil
}

// printPhases prints the median of each phase over ps.
func printPhases(out io.Writer, label string, ps []phases) {
	med := func(get func(phases) time.Duration) time.Duration {
		ds := make([]time.Duration, len(ps))
		for i, p := range ps {
			ds[i] = get(p)
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	fmt.Fprintf(out, "| %s | %d | %s | %s | %s | %s |\n", label, len(ps),
		ms(med(func(p phases) time.Duration { return p.pickup })),
		ms(med(func(p phases) time.Duration { return p.toSend })),
		ms(med(func(p phases) time.Duration { return p.send })),
		ms(med(func(p phases) time.Duration { return p.toRecord })))
}
