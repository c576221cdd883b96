package teamnexus_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nexus-rpc/sdk-go/nexus"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamnexus"
)

// TestOperationError: every handler error fails the operation (so Nexus does not retry it
// behind the workflow's back), with the error's kind, message and wait as its cause.
func TestOperationError(t *testing.T) {
	t.Parallel()
	require.NoError(t, teamnexus.OperationError(nil))
	for _, tc := range []struct {
		err          error
		typ          string
		nonRetryable bool
		wait         time.Duration
	}{
		{delivery.Permanent(errors.New("order 42 is cancelled")), delivery.ErrTypePermanent, true, 0},
		{delivery.Retryable(errors.New("busy"), 3*time.Second), delivery.ErrTypeRetryable, false, 3 * time.Second},
		{delivery.Ambiguous(errors.New("reset")), delivery.ErrTypeAmbiguous, false, 0},
		{errors.New("unmarked"), delivery.ErrTypeAmbiguous, false, 0},
	} {
		var opErr *nexus.OperationError
		require.ErrorAs(t, teamnexus.OperationError(tc.err), &opErr, "%v", tc.err)
		require.Equal(t, nexus.OperationStateFailed, opErr.State)
		require.Equal(t, tc.err.Error(), opErr.Message)
		var appErr *temporal.ApplicationError
		require.ErrorAs(t, opErr.Cause, &appErr)
		require.Equal(t, tc.typ, appErr.Type(), "%v", tc.err)
		require.Equal(t, tc.nonRetryable, appErr.NonRetryable(), "%v", tc.err)
		require.Equal(t, tc.wait, appErr.NextRetryDelay(), "%v", tc.err)
	}
}

// TestConfig: the settings are checked with errors that name the key, the timeout
// defaults to the topic's, and the JSON of the workflow's input keeps it as text.
func TestConfig(t *testing.T) {
	t.Parallel()
	c := teamnexus.Config{Endpoint: "orders", Service: "orders", Operation: "deliver", CheckOperation: "delivered"}.WithDefaults(30 * time.Second)
	require.NoError(t, c.Validate())
	require.Equal(t, 30*time.Second, c.Timeout)
	require.Equal(t, "orders/orders/deliver", c.String())
	raw, err := json.Marshal(c)
	require.NoError(t, err)
	require.JSONEq(t, `{"endpoint":"orders","service":"orders","operation":"deliver","check_operation":"delivered","timeout":"30s"}`, string(raw))
	var back teamnexus.Config
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, c, back)

	for _, tc := range []struct {
		c    teamnexus.Config
		want string
	}{
		{teamnexus.Config{Service: "s", Operation: "o"}, "nexus.endpoint must name the Nexus endpoint, got an empty name"},
		{teamnexus.Config{Endpoint: "e", Service: "s", Operation: "o", CheckOperation: "o"}, "nexus.check_operation must differ from nexus.operation (o)"},
		{teamnexus.Config{Endpoint: "e", Service: "s", Operation: "o", Timeout: -time.Second}, "nexus.timeout must be positive, got -1s"},
	} {
		require.ErrorContains(t, tc.c.WithDefaults(time.Second).Validate(), tc.want)
	}
}
