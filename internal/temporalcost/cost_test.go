package temporalcost

import (
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
)

func event(id int64, t enumspb.EventType) *historypb.HistoryEvent {
	return &historypb.HistoryEvent{EventId: id, EventType: t}
}

func TestCountFollowsThePricingRules(t *testing.T) {
	started := func(scheduled int64, attempt int32) *historypb.HistoryEvent {
		ev := event(0, enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED)
		ev.Attributes = &historypb.HistoryEvent_ActivityTaskStartedEventAttributes{ActivityTaskStartedEventAttributes: &historypb.ActivityTaskStartedEventAttributes{ScheduledEventId: scheduled, Attempt: attempt}}
		return ev
	}
	marker := func(name string, task int64) *historypb.HistoryEvent {
		ev := event(0, enumspb.EVENT_TYPE_MARKER_RECORDED)
		ev.Attributes = &historypb.HistoryEvent_MarkerRecordedEventAttributes{MarkerRecordedEventAttributes: &historypb.MarkerRecordedEventAttributes{MarkerName: name, WorkflowTaskCompletedEventId: task}}
		return ev
	}
	upsert := func(id int64, names ...string) *historypb.HistoryEvent {
		ev := event(id, enumspb.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)
		fields := map[string]*commonpb.Payload{}
		for _, n := range names {
			fields[n] = &commonpb.Payload{Data: []byte(`["x"]`)}
		}
		ev.Attributes = &historypb.HistoryEvent_UpsertWorkflowSearchAttributesEventAttributes{UpsertWorkflowSearchAttributesEventAttributes: &historypb.UpsertWorkflowSearchAttributesEventAttributes{
			SearchAttributes: &commonpb.SearchAttributes{IndexedFields: fields},
		}}
		return ev
	}
	h := []*historypb.HistoryEvent{
		event(1, enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED), // 1
		event(2, enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
		event(3, enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED),
		event(4, enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
		marker("LocalActivity", 4), // two local activities of one task: 1
		marker("LocalActivity", 4),
		marker("Version", 4),                               // free
		upsert(6, "TemporalChangeVersion"),                 // free: it comes with the version marker
		upsert(6, "OutboxStatus"),                          // 1
		upsert(6, "OutboxStatus", "TemporalChangeVersion"), // 1
		event(7, enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
		started(7, 3), // three attempts of one activity: 3
		event(9, enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
		event(10, enumspb.EVENT_TYPE_TIMER_STARTED), // 1
		event(12, enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
		marker("LocalActivity", 12),     // another task's: 1
		marker("SideEffect", 12),        // 1
		marker("MutableSideEffect", 12), // a value recorded: 1
		event(15, enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED),
		event(16, enumspb.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED),         // a child started: 1
		event(17, enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED), // its ID taken:
		event(18, enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED),    // no start, none
		event(16, enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),                  // scheduled, not started yet: 1
		event(17, enumspb.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED),                // 1
		event(18, enumspb.EVENT_TYPE_NEXUS_OPERATION_COMPLETED),
		event(19, enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
	}
	got := Count(h)
	if want := (Cost{Actions: 14, Events: len(h)}); got != want {
		t.Fatalf("Count = %+v, want %+v", got, want)
	}
}
