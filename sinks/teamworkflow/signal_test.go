package teamworkflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamworkflow"
)

// refusing is a Temporal client whose signal-with-start fails with err.
type refusing struct {
	client.Client
	err error
}

func (r refusing) SignalWithStartWorkflow(context.Context, string, string, any, client.StartWorkflowOptions, any, ...any) (client.WorkflowRun, error) {
	return nil, r.err
}

// A request Temporal refuses as such (too large, no such namespace, no permission) is a
// permanent failure, dead-lettered with the reason; anything else is retried.
func TestSignalWithStartFailures(t *testing.T) {
	t.Parallel()
	in := teamworkflow.SignalInput{WorkflowID: "order-7", Workflow: "OrderWorkflow", TaskQueue: "orders", Signal: "created",
		IDReuse: "allow_duplicate", Message: delivery.Message{MessageID: "m", Topic: "order.created", Attempt: 1}}
	for _, tc := range []struct {
		err       error
		typ       string
		permanent bool
	}{
		{serviceerror.NewInvalidArgument("BlobSizeLimitError: payload too large"), delivery.ErrTypePermanent, true},
		{serviceerror.NewNamespaceNotFound("orders"), delivery.ErrTypePermanent, true},
		{serviceerror.NewPermissionDenied("no", ""), delivery.ErrTypePermanent, true},
		{serviceerror.NewUnavailable("frontend restarting"), delivery.ErrTypeRetryable, false},
		{errors.New("connection reset"), delivery.ErrTypeRetryable, false},
	} {
		_, err := teamworkflow.Signaler{Client: refusing{err: tc.err}}.SignalWithStart(context.Background(), in)
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, err, &appErr, "%v", tc.err)
		require.Equal(t, tc.typ, appErr.Type(), "%v", tc.err)
		require.Equal(t, tc.permanent, appErr.NonRetryable(), "%v", tc.err)
		require.Contains(t, appErr.Message(), tc.err.Error())
	}
}

// signalled is a Temporal client whose workflow's latest run closed with the signal of
// message m in its history; a signal-with-start fails the test.
type signalled struct {
	client.Client
	t      *testing.T
	signal string
	m      string
}

func (c signalled) DescribeWorkflowExecution(_ context.Context, id, _ string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	return &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: &workflowpb.WorkflowExecutionInfo{
		Execution: &commonpb.WorkflowExecution{WorkflowId: id, RunId: "run-1"},
		Status:    enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED,
	}}, nil
}

func (c signalled) GetWorkflowHistory(context.Context, string, string, bool, enumspb.HistoryEventFilterType) client.HistoryEventIterator {
	return &events{list: []*historypb.HistoryEvent{{
		EventType: enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
		Attributes: &historypb.HistoryEvent_WorkflowExecutionSignaledEventAttributes{WorkflowExecutionSignaledEventAttributes: &historypb.WorkflowExecutionSignaledEventAttributes{
			SignalName: c.signal,
			Input:      &commonpb.Payloads{Payloads: []*commonpb.Payload{{Data: []byte(`{"message_id":"` + c.m + `"}`)}}},
		}},
	}}}
}

func (c signalled) SignalWithStartWorkflow(context.Context, string, string, any, client.StartWorkflowOptions, any, ...any) (client.WorkflowRun, error) {
	c.t.Error("signal-with-start sent a second copy")
	return nil, errors.New("second copy")
}

type events struct{ list []*historypb.HistoryEvent }

func (e *events) HasNext() bool { return len(e.list) > 0 }
func (e *events) Next() (*historypb.HistoryEvent, error) {
	ev := e.list[0]
	e.list = e.list[1:]
	return ev, nil
}

// A run handed a message an earlier run may have signalled looks for that signal before
// its first attempt too: the target's run may have closed since, and a signal-with-start
// would start a new run with a second copy.
func TestSignalOfAMessageThatMayHaveBeenSentLooksFirst(t *testing.T) {
	t.Parallel()
	in := teamworkflow.SignalInput{WorkflowID: "order-7", Workflow: "OrderWorkflow", TaskQueue: "orders", Signal: "created",
		IDReuse: "allow_duplicate", Message: delivery.Message{MessageID: "m-1", Topic: "order.created", Attempt: 1}, MayHaveBeenSent: true}
	got, err := teamworkflow.Signaler{Client: signalled{t: t, signal: "created", m: "m-1"}}.SignalWithStart(context.Background(), in)
	require.NoError(t, err)
	require.Equal(t, teamworkflow.Started{WorkflowID: "order-7", RunID: "run-1"}, got)
}
