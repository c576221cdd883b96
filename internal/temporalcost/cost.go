// Package temporalcost counts what a workflow run costs on Temporal Cloud, from its
// history: the actions its pricing counts, and the history events.
//
// The rules (Temporal Cloud's pricing page, "Actions"): the workflow start is one action;
// each activity attempt is one; each timer; each search-attribute upsert after the start;
// each signal sent to another workflow, and each signal the run receives; each child
// workflow started (counted when it started: a start whose ID is taken starts none); each
// Nexus operation scheduled, and each cancellation of one asked for; each side effect,
// and each value a mutable side effect records (it records one only when the value
// changes). The local activities that one workflow task records count together as one
// action. Search attributes given at the start, version markers and the
// TemporalChangeVersion search attribute update that the SDK sends with a version marker
// are free. A namespace's actions-per-second limit then caps messages per second at the
// limit ÷ the actions per message.
package temporalcost

import (
	"context"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
)

// Cost is what one or more runs cost.
type Cost struct {
	Actions int // as Temporal Cloud counts them
	Events  int // history events
}

// Add returns the sum of c and d.
func (c Cost) Add(d Cost) Cost {
	return Cost{Actions: c.Actions + d.Actions, Events: c.Events + d.Events}
}

// The marker names the Go SDK records.
const (
	localActivityMarker     = "LocalActivity"
	sideEffectMarker        = "SideEffect"
	mutableSideEffectMarker = "MutableSideEffect"
)

// changeVersionAttribute is the search attribute the SDK updates with each version
// marker; Temporal Cloud does not count an update of it alone.
const changeVersionAttribute = "TemporalChangeVersion"

// Count returns the cost of one run's history.
func Count(events []*historypb.HistoryEvent) Cost {
	c := Cost{Events: len(events)}
	// Activity attempts: a retried activity keeps one scheduled event; its last started
	// event carries the attempt that ran (earlier attempts ran too).
	attempts := map[int64]int32{} // scheduled event ID -> attempts
	laTasks := map[int64]bool{}   // workflow tasks that recorded a local activity
	for _, ev := range events {
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
			enumspb.EVENT_TYPE_TIMER_STARTED,
			enumspb.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
			enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
			enumspb.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED,
			enumspb.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED,
			enumspb.EVENT_TYPE_NEXUS_OPERATION_CANCEL_REQUESTED:
			c.Actions++
		case enumspb.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
			if !onlyChangeVersion(ev.GetUpsertWorkflowSearchAttributesEventAttributes().GetSearchAttributes().GetIndexedFields()) {
				c.Actions++
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			attempts[ev.GetEventId()] = max(attempts[ev.GetEventId()], 1)
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			a := ev.GetActivityTaskStartedEventAttributes()
			attempts[a.GetScheduledEventId()] = max(attempts[a.GetScheduledEventId()], a.GetAttempt())
		case enumspb.EVENT_TYPE_MARKER_RECORDED:
			m := ev.GetMarkerRecordedEventAttributes()
			switch m.GetMarkerName() {
			case localActivityMarker:
				laTasks[m.GetWorkflowTaskCompletedEventId()] = true
			case sideEffectMarker, mutableSideEffectMarker:
				c.Actions++
			}
		}
	}
	for _, n := range attempts {
		c.Actions += int(n)
	}
	c.Actions += len(laTasks)
	return c
}

// onlyChangeVersion reports whether a search-attribute update sets TemporalChangeVersion
// and nothing else.
func onlyChangeVersion[V any](fields map[string]V) bool {
	_, ok := fields[changeVersionAttribute]
	return ok && len(fields) == 1
}

// OfRun reads a run's history (runID empty: the latest run of workflowID) and counts it.
func OfRun(ctx context.Context, c client.Client, workflowID, runID string) (Cost, error) {
	iter := c.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events []*historypb.HistoryEvent
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			return Cost{}, err
		}
		events = append(events, ev)
	}
	return Count(events), nil
}
