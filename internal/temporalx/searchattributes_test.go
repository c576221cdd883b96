package temporalx

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
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
