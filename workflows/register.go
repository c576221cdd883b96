package workflows

import (
	"fmt"

	"go.temporal.io/sdk/workflow"
)

// RegisterOptions returns the options Delivery is registered with.
func RegisterOptions() workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: WorkflowType}
}

// DeliveryOf returns Delivery for the worker of one deployment (store.Store.DeploymentID):
// a run whose input names another deployment panics before it does anything. Register it
// in Delivery's place (worker.Register does) on a worker whose deployment is known.
//
// The panic fails the workflow task, not the run (under the SDK's default
// WorkflowPanicPolicy, BlockWorkflow): no command is sent, so no local activity (load,
// mark-sent, dead-letter) runs against this worker's database, and the server schedules
// the task again on the task queue, where a worker of the message's own deployment can
// take it. The SDK answers the first failed attempt at once and lets later ones time out
// (the workflow task timeout, 10s by default, growing from the fourth attempt to at most
// 10 minutes more), so a run that only a wrong worker polls for waits without closing,
// and its history does not grow (a retried workflow task is transient).
//
// An input without a deployment (a run started by an older relay) runs as before.
func DeliveryOf(deployment string) func(workflow.Context, DeliveryInput) (DeliveryResult, error) {
	if deployment == "" {
		return Delivery
	}
	return func(ctx workflow.Context, in DeliveryInput) (DeliveryResult, error) {
		if in.Deployment != "" && in.Deployment != deployment {
			panic(fmt.Sprintf("%s: message %s belongs to outbox deployment %s, and this worker's is %s: "+
				"left for a worker of its own deployment (a task queue belongs to one outbox database)",
				ErrTypeWrongDeployment, in.MessageID, in.Deployment, deployment))
		}
		return Delivery(ctx, in)
	}
}

// BatchRegisterOptions returns the options Batch is registered with.
func BatchRegisterOptions() workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: BatchWorkflowType}
}

// BatchOf is DeliveryOf for Batch: a batch whose input names another deployment panics
// before it does anything, and is left for a worker of its own deployment.
func BatchOf(deployment string) func(workflow.Context, BatchInput) (BatchResult, error) {
	if deployment == "" {
		return Batch
	}
	return func(ctx workflow.Context, in BatchInput) (BatchResult, error) {
		if in.Deployment != "" && in.Deployment != deployment {
			panic(fmt.Sprintf("%s: a batch of %d %s messages belongs to outbox deployment %s, and this worker's is %s: "+
				"left for a worker of its own deployment (a task queue belongs to one outbox database)",
				ErrTypeWrongDeployment, len(in.Messages), in.Topic, in.Deployment, deployment))
		}
		return Batch(ctx, in)
	}
}
