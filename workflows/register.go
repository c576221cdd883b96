package workflows

import "go.temporal.io/sdk/workflow"

// RegisterOptions returns the options Delivery is registered with.
func RegisterOptions() workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: WorkflowType}
}
