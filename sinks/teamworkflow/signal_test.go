package teamworkflow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
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
