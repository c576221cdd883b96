package teamworkflow

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
)

// SignalInput is the input of the signal-with-start activity (its JSON names are those of
// the delivery workflow's history).
type SignalInput struct {
	WorkflowID string           `json:"workflow_id"`
	Workflow   string           `json:"workflow"`
	TaskQueue  string           `json:"task_queue"`
	Signal     string           `json:"signal"`
	IDReuse    string           `json:"id_reuse"`
	Message    delivery.Message `json:"message"`
	// MayHaveBeenSent is set when an earlier run of the delivery may have signalled the
	// message already (the run was handed the message again, or from a batch): even its
	// first attempt then looks for that signal first, as every later attempt does.
	MayHaveBeenSent bool `json:"may_have_been_sent,omitempty"`
}

// Started identifies a workflow a delivery started or signalled.
type Started struct {
	WorkflowID string `json:"workflow_id"`
	RunID      string `json:"run_id,omitempty"` // empty when it was found already started
}

// Signaler delivers a message of a topic with a signal: to the team's workflow, started
// first when it is not running. The outbox's worker runs it as the signal activity.
type Signaler struct {
	// Client is the worker's Temporal client.
	Client client.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnTargetClosed, when set, is told of each message whose workflow had closed and may
	// not start again (a metric counts them).
	OnTargetClosed func(topic string)
}

func (s Signaler) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// SignalWithStart signals a team's workflow with a message, starting the workflow first
// when it is not running (Temporal's signal-with-start), for a topic whose workflow handler
// names a signal. When the workflow of that ID closed, the signal starts a new run if the
// topic's workflow_id_reuse allows one (allow_duplicate, the default for signals); if it
// does not, the message was delivered to no one: the failure is permanent (the message is
// dead-lettered) and names the closed run, and outbox_signal_target_closed_total counts
// it. It needs the worker's Temporal client.
func (s Signaler) SignalWithStart(ctx context.Context, in SignalInput) (Started, error) {
	if s.Client == nil {
		return Started{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("topic %s signals workflow %s, but this worker has no Temporal client for it (worker.Deps.Client)", in.Message.Topic, in.Workflow),
			delivery.ErrTypePermanent, nil)
	}
	reuse, ok := IDReusePolicies[in.IDReuse]
	if !ok {
		return Started{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("workflow_id_reuse %q is not a reuse policy", in.IDReuse), delivery.ErrTypePermanent, nil)
	}
	if in.Message.Attempt > 1 || in.MayHaveBeenSent {
		// An earlier attempt may have signalled a run that has closed since (the signal
		// finished it): another signal-with-start would start a new run with a second copy.
		if found, ok := s.signalledRun(ctx, in); ok {
			return found, nil
		}
	}
	run, err := s.Client.SignalWithStartWorkflow(ctx, in.WorkflowID, in.Signal, in.Message, client.StartWorkflowOptions{
		ID: in.WorkflowID, TaskQueue: in.TaskQueue, WorkflowIDReusePolicy: reuse,
	}, in.Workflow, in.Message)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	switch {
	case errors.As(err, &started):
		if found, ok := s.signalledRun(ctx, in); ok {
			return found, nil // an earlier attempt's signal reached it before it closed
		}
		if s.OnTargetClosed != nil {
			s.OnTargetClosed(in.Message.Topic)
		}
		closed := "run " + started.RunId
		if desc, derr := s.Client.DescribeWorkflowExecution(ctx, in.WorkflowID, ""); derr == nil {
			info := desc.GetWorkflowExecutionInfo()
			closed = fmt.Sprintf("run %s, %s", info.GetExecution().GetRunId(), strings.ToLower(strings.TrimPrefix(info.GetStatus().String(), "WORKFLOW_EXECUTION_STATUS_")))
		}
		return Started{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("signal %s not delivered: workflow %s is closed (%s) and workflow_id_reuse %s lets no new run start; set workflow_id_reuse: allow_duplicate to start a new run with the signal, then redrive",
				in.Signal, in.WorkflowID, closed, in.IDReuse),
			delivery.ErrTypePermanent, nil)
	case refusedForGood(err):
		// Temporal refused the request itself (a payload over its limit, a namespace that
		// does not exist, a client without the permission): no retry changes that.
		return Started{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("signal-with-start %s of workflow %s refused: %v", in.Signal, in.WorkflowID, err), delivery.ErrTypePermanent, nil)
	case err != nil:
		return Started{}, temporal.NewApplicationError(
			fmt.Sprintf("signal-with-start %s of workflow %s: %v", in.Signal, in.WorkflowID, err), delivery.ErrTypeRetryable)
	}
	return Started{WorkflowID: run.GetID(), RunID: run.GetRunID()}, nil
}

// refusedForGood reports whether err is Temporal refusing a request as such: an invalid
// argument, a namespace that is not found, or a permission the client lacks.
func refusedForGood(err error) bool {
	var (
		invalid   *serviceerror.InvalidArgument
		notFound  *serviceerror.NamespaceNotFound
		forbidden *serviceerror.PermissionDenied
	)
	return errors.As(err, &invalid) || errors.As(err, &notFound) || errors.As(err, &forbidden)
}

// signalledRun reports whether the workflow's latest run is closed and its history has
// the signal with this message (an earlier attempt delivered it, and its answer was
// lost). It looks for the message ID in the signal's payload, so with an encrypting
// codec it finds nothing, and the message is signalled again or fails as if it did not.
func (s Signaler) signalledRun(ctx context.Context, in SignalInput) (Started, bool) {
	desc, err := s.Client.DescribeWorkflowExecution(ctx, in.WorkflowID, "")
	if err != nil || desc.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return Started{}, false
	}
	runID := desc.GetWorkflowExecutionInfo().GetExecution().GetRunId()
	id := []byte(in.Message.MessageID)
	iter := s.Client.GetWorkflowHistory(ctx, in.WorkflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			return Started{}, false
		}
		sig := ev.GetWorkflowExecutionSignaledEventAttributes()
		if sig == nil || sig.GetSignalName() != in.Signal {
			continue
		}
		for _, p := range sig.GetInput().GetPayloads() {
			if bytes.Contains(p.GetData(), id) {
				s.logger().InfoContext(ctx, "An earlier attempt's signal reached the workflow before it closed; delivered",
					"workflow_id", in.WorkflowID, "run_id", runID)
				return Started{WorkflowID: in.WorkflowID, RunID: runID}, true
			}
		}
	}
	return Started{}, false
}
