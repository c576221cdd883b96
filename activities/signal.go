package activities

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/workflows"
)

// SignalWithStart signals a team's workflow with a message, starting the workflow first
// when it is not running (Temporal's signal-with-start), for a topic whose workflow handler
// names a signal. A workflow of that ID that closed, where the topic's workflow_id_reuse
// does not allow another, counts as delivered. It needs the worker's Temporal client.
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
		a.logger().InfoContext(ctx, "Workflow closed and may not start again; counted as delivered", "workflow_id", in.WorkflowID)
		return workflows.StartedWorkflow{WorkflowID: in.WorkflowID}, nil
	case err != nil:
		return workflows.StartedWorkflow{}, temporal.NewApplicationError(
			fmt.Sprintf("signal-with-start %s of workflow %s: %v", in.Signal, in.WorkflowID, err), workflows.ErrTypeRetryable)
	}
	return workflows.StartedWorkflow{WorkflowID: run.GetID(), RunID: run.GetRunID()}, nil
}
