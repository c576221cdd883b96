package temporalx

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
)

// listing is a Temporal client whose search attribute list fails with err.
type listing struct {
	client.Client
	err error
}

func (l listing) OperatorService() operatorservice.OperatorServiceClient { return operator{err: l.err} }

type operator struct {
	operatorservice.OperatorServiceClient
	err error
}

func (o operator) ListSearchAttributes(context.Context, *operatorservice.ListSearchAttributesRequest, ...grpc.CallOption) (*operatorservice.ListSearchAttributesResponse, error) {
	return nil, o.err
}

// A Temporal that does not answer is told apart from one that answers that the search
// attributes are missing: the process may retry the first (exit 69), not the second.
func TestSearchAttributesOfATemporalThatDoesNotAnswer(t *testing.T) {
	for _, cause := range []error{serviceerror.NewUnavailable("frontend restarting"), serviceerror.NewDeadlineExceeded("slow"), context.DeadlineExceeded} {
		err := EnsureSearchAttributes(context.Background(), listing{err: cause}, "default")
		require.ErrorIs(t, err, cause)
		require.True(t, Unanswered(err), "%v", err)
		require.NotContains(t, err.Error(), "are missing")
	}
	err := EnsureSearchAttributes(context.Background(), listing{err: serviceerror.NewPermissionDenied("no", "")}, "default")
	require.False(t, Unanswered(err))
	require.ErrorContains(t, err, "are missing")
}

// A process stopped while it reads the search attributes says it was stopped, not that
// the attributes are missing: the command exits 0 for a stop.
func TestSearchAttributesReadWhileStopping(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := EnsureSearchAttributes(ctx, listing{err: serviceerror.NewCanceled("context canceled")}, "default")
	require.ErrorIs(t, err, context.Canceled)
	require.NotContains(t, err.Error(), "are missing")
	require.False(t, IsNamespaceNotFound(err))
}

// describing is a Temporal client whose namespace description fails with err.
type describing struct {
	client.Client
	err error
}

func (d describing) WorkflowService() workflowservice.WorkflowServiceClient {
	return namespaces{err: d.err}
}

type namespaces struct {
	workflowservice.WorkflowServiceClient
	err error
}

func (n namespaces) DescribeNamespace(context.Context, *workflowservice.DescribeNamespaceRequest, ...grpc.CallOption) (*workflowservice.DescribeNamespaceResponse, error) {
	return &workflowservice.DescribeNamespaceResponse{}, n.err
}

// Without the search attribute check, the namespace is still checked: one that does not
// exist is named as such, a Temporal that does not answer is told apart, and a refusal
// to describe it (a key without that permission) is no proof that it is missing.
func TestCheckNamespace(t *testing.T) {
	ctx := context.Background()
	require.NoError(t, CheckNamespace(ctx, describing{}, "orders"))
	err := CheckNamespace(ctx, describing{err: serviceerror.NewNamespaceNotFound("orders")}, "orders")
	require.True(t, IsNamespaceNotFound(err), "%v", err)
	require.ErrorContains(t, err, `namespace "orders" not found`)
	err = CheckNamespace(ctx, describing{err: serviceerror.NewUnavailable("frontend restarting")}, "orders")
	require.True(t, Unanswered(err), "%v", err)
	require.NoError(t, CheckNamespace(ctx, describing{err: serviceerror.NewPermissionDenied("no", "")}, "orders"))
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, CheckNamespace(stopped, describing{err: serviceerror.NewCanceled("context canceled")}, "orders"), context.Canceled)
}
