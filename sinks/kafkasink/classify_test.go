package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-go/outbox/delivery"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	const (
		permanent = "permanent"
		retryable = "retryable"
		ambiguous = "ambiguous"
	)
	// The client gives a record up without always knowing whether an earlier request
	// wrote it, so only what it refused before buffering the record is retryable.
	for _, tc := range []struct {
		err  error
		want string
	}{
		{kerr.UnknownTopicOrPartition, permanent},
		{kerr.UnknownTopicID, permanent},
		{fmt.Errorf("%w (uncompressed_bytes=2097152)", kerr.MessageTooLarge), permanent},
		{kerr.RecordListTooLarge, permanent},
		{kerr.InvalidRecord, permanent},
		{kerr.InvalidTimestamp, permanent},
		{kerr.InvalidTopicException, permanent},
		{kerr.TopicAuthorizationFailed, permanent},
		{kerr.ClusterAuthorizationFailed, permanent},
		{kerr.SaslAuthenticationFailed, permanent},
		{kerr.PolicyViolation, permanent},
		{kerr.NotEnoughReplicas, ambiguous},
		{kerr.NotLeaderForPartition, ambiguous},
		{kerr.ThrottlingQuotaExceeded, ambiguous},
		{kerr.UnknownServerError, ambiguous},
		{kerr.RequestTimedOut, ambiguous},
		{kerr.NotEnoughReplicasAfterAppend, ambiguous},
		{context.DeadlineExceeded, ambiguous},
		{context.Canceled, ambiguous},
		{kgo.ErrRecordTimeout, ambiguous},
		{kgo.ErrRecordRetries, ambiguous},
		{kgo.ErrMaxBuffered, retryable},
		{kgo.ErrClientClosed, ambiguous},
		{errors.New("read tcp: connection reset by peer"), ambiguous},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			err := classify("orders", tc.err)
			got := ambiguous
			if delivery.IsPermanent(err) {
				got = permanent
			} else if _, ok := delivery.IsRetryable(err); ok {
				got = retryable
			}
			assert.Equal(t, tc.want, got, "%v", err)
			assert.ErrorIs(t, err, tc.err)
			assert.Contains(t, err.Error(), `topic "orders"`)
		})
	}
	assert.NoError(t, classify("orders", nil))
}
