package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/workflows"
)

// SignalWithStart signals a team's workflow with a message, starting the workflow first
// when it is not running (Temporal's signal-with-start), for a topic whose workflow handler
// names a signal. When the workflow of that ID closed, the signal starts a new run if the
// topic's workflow_id_reuse allows one (allow_duplicate, the default for signals); if it
// does not, the message was delivered to no one: the failure is permanent (the message is
// dead-lettered) and names the closed run, and outbox_signal_target_closed_total counts
// it. It needs the worker's Temporal client.
func (a *Activities) SignalWithStart(ctx context.Context, in workflows.SignalWithStartInput) (workflows.StartedWorkflow, error) {
	if a.Client == nil {
		return workflows.StartedWorkflow{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("topic %s signals workflow %s, but this worker has no Temporal client for it (worker.Deps.Client)", in.Message.Topic, in.Workflow),
			workflows.ErrTypePermanent, nil)
	}
	reuse, ok := workflows.IDReusePolicies[in.IDReuse]
	if !ok {
		return workflows.StartedWorkflow{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("workflow_id_reuse %q is not a reuse policy", in.IDReuse), workflows.ErrTypePermanent, nil)
	}
	run, err := a.Client.SignalWithStartWorkflow(ctx, in.WorkflowID, in.Signal, in.Message, client.StartWorkflowOptions{
		ID: in.WorkflowID, TaskQueue: in.TaskQueue, WorkflowIDReusePolicy: reuse,
	}, in.Workflow, in.Message)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	switch {
	case errors.As(err, &started):
		a.Metrics.SignalTargetClosed(in.Message.Topic)
		closed := "run " + started.RunId
		if desc, derr := a.Client.DescribeWorkflowExecution(ctx, in.WorkflowID, ""); derr == nil {
			info := desc.GetWorkflowExecutionInfo()
			closed = fmt.Sprintf("run %s, %s", info.GetExecution().GetRunId(), strings.ToLower(strings.TrimPrefix(info.GetStatus().String(), "WORKFLOW_EXECUTION_STATUS_")))
		}
		return workflows.StartedWorkflow{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("signal %s not delivered: workflow %s is closed (%s) and workflow_id_reuse %s lets no new run start; set workflow_id_reuse: allow_duplicate to start a new run with the signal, then redrive",
				in.Signal, in.WorkflowID, closed, in.IDReuse),
			workflows.ErrTypePermanent, nil)
	case err != nil:
		return workflows.StartedWorkflow{}, temporal.NewApplicationError(
			fmt.Sprintf("signal-with-start %s of workflow %s: %v", in.Signal, in.WorkflowID, err), workflows.ErrTypeRetryable)
	}
	return workflows.StartedWorkflow{WorkflowID: run.GetID(), RunID: run.GetRunID()}, nil
}
