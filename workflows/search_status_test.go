package workflows_test

import (
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/workflows"
)

// TestDeliveredRunLeavesOutboxStatusAlone: from DeliveryVersion 3 a delivered message's run
// makes no search-attribute upsert (one action less): its Completed status says sent. A
// run of version 2 (in flight across an upgrade) still sets OutboxStatus to sent, as its
// history did; retrying and dead are set by both.
func TestDeliveredRunLeavesOutboxStatusAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version int
		errs    []error
		want    []string
	}{
		{workflows.DeliveryVersion, []error{nil}, nil},
		{workflows.DeliveryVersion, []error{retryable("busy"), nil}, []string{"retrying"}},
		{2, []error{nil}, []string{"sent"}},
		{2, []error{retryable("busy"), nil}, []string{"retrying", "sent"}},
	} {
		b := setup(t, workflows.Policy{MaxAttempts: 3})
		b.input.Version, b.input.SearchAttributes = tc.version, true
		b.onSend(t, tc.errs...)
		b.env.OnActivity(workflows.ActivityMarkSent, mock.Anything, mock.Anything).Return(nil)
		upserts := b.recordUpserts()
		_, err := b.run()
		require.NoError(t, err)
		require.Equal(t, tc.want, *upserts, "version %d, %d attempts", tc.version, len(tc.errs))
	}
}
