package activities

import (
	"context"

	"github.com/outbox-go/outbox/sinks/teamworkflow"
	"github.com/outbox-go/outbox/workflows"
)

// SignalWithStart is the signal activity of a topic whose workflow handler names a
// signal: teamworkflow.Signaler with the worker's client, logger and metrics.
func (a *Activities) SignalWithStart(ctx context.Context, in workflows.SignalWithStartInput) (workflows.StartedWorkflow, error) {
	s := teamworkflow.Signaler{Client: a.Client, Logger: a.logger(), OnTargetClosed: a.Metrics.SignalTargetClosed}
	return s.SignalWithStart(ctx, in)
}
