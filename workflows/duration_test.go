package workflows_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/workflows"
)

func TestInputDurationsAsText(t *testing.T) {
	t.Parallel()

	t.Run("PolicyWritesText", func(t *testing.T) {
		t.Parallel()
		p := workflows.Policy{MaxAttempts: 4, InitialInterval: time.Second, BackoffCoefficient: 2, MaxInterval: 90 * time.Second, SendTimeout: 30 * time.Second}
		b, err := json.Marshal(workflows.DeliveryInput{MessageID: "m", Topic: "t", Policy: p})
		require.NoError(t, err)
		require.JSONEq(t, `{"message_id":"m","topic":"t","search_attributes":false,"policy":{"max_attempts":4,"initial_interval":"1s","backoff_coefficient":2,"max_interval":"1m30s","send_timeout":"30s"}}`, string(b))

		var back workflows.DeliveryInput
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, p, back.Policy)

		p.MarkSentTimeout = 10 * time.Minute
		b, err = json.Marshal(p)
		require.NoError(t, err)
		require.Contains(t, string(b), `"mark_sent_timeout":"10m0s"`)

		// Every field of a filled policy comes back.
		full := workflows.Policy{MaxAttempts: 4, FirstAttempt: workflows.FirstAttemptActivity,
			Workflow: &workflows.WorkflowHandler{Workflow: "W", TaskQueue: "q"}}.WithDefaults()
		b, err = json.Marshal(full)
		require.NoError(t, err)
		require.Contains(t, string(b), `"first_attempt":"activity"`)
		var again workflows.Policy
		require.NoError(t, json.Unmarshal(b, &again))
		require.Equal(t, full, again)
	})

	t.Run("PolicyReadsNanoseconds", func(t *testing.T) {
		t.Parallel()
		// The form histories recorded before durations were written as text hold.
		var p workflows.Policy
		require.NoError(t, json.Unmarshal([]byte(`{"max_attempts":4,"initial_interval":50000000,"backoff_coefficient":2,"max_interval":200000000,"send_timeout":5000000000}`), &p))
		require.Equal(t, workflows.Policy{MaxAttempts: 4, InitialInterval: 50 * time.Millisecond, BackoffCoefficient: 2, MaxInterval: 200 * time.Millisecond, SendTimeout: 5 * time.Second}, p)
	})

	t.Run("BadDuration", func(t *testing.T) {
		t.Parallel()
		var p workflows.Policy
		err := json.Unmarshal([]byte(`{"initial_interval":"soon"}`), &p)
		require.ErrorContains(t, err, `duration must be text such as "1s" or "1m30s", got "soon"`)
		err = json.Unmarshal([]byte(`{"initial_interval":true}`), &p)
		require.ErrorContains(t, err, "got true")
	})

	t.Run("RetentionInput", func(t *testing.T) {
		t.Parallel()
		in := workflows.RetentionInput{SentAfter: 168 * time.Hour, DiscardedAfter: 720 * time.Hour, BatchSize: 500}
		b, err := json.Marshal(in)
		require.NoError(t, err)
		require.JSONEq(t, `{"sent_after":"168h0m0s","discarded_after":"720h0m0s","archive":false,"batch_size":500}`, string(b))
		var back workflows.RetentionInput
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, in, back)
		require.NoError(t, json.Unmarshal([]byte(`{"sent_after":604800000000000,"discarded_after":2592000000000000,"archive":true,"batch_size":500}`), &back))
		require.Equal(t, workflows.RetentionInput{SentAfter: 168 * time.Hour, DiscardedAfter: 720 * time.Hour, Archive: true, BatchSize: 500}, back)
	})

	t.Run("BatchLane", func(t *testing.T) {
		t.Parallel()
		policy := workflows.Policy{MaxAttempts: 4, Batch: &workflows.BatchPolicy{Size: 50, Wait: 250 * time.Millisecond, Concurrency: 8}}.WithDefaults()
		in := workflows.BatchInput{Topic: "clicks", Policy: policy, Messages: []workflows.BatchMessage{{MessageID: "m"}}, Version: 5}
		b, err := json.Marshal(in)
		require.NoError(t, err)
		require.Contains(t, string(b), `"batch":{"size":50,"concurrency":8,"wait":"250ms"}`)
		var back workflows.BatchInput
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, in, back)

		d := workflows.DeliveryInput{MessageID: "m", Topic: "clicks", Policy: policy, Prior: &workflows.PriorAttempt{
			Attempts: 1, Error: "HTTP 429", ErrType: workflows.ErrTypeRetryable, RetryAfter: 3 * time.Second, Batch: "outbox-batch-m"}}
		b, err = json.Marshal(d)
		require.NoError(t, err)
		require.Contains(t, string(b), `"retry_after":"3s"`)
		var dback workflows.DeliveryInput
		require.NoError(t, json.Unmarshal(b, &dback))
		require.Equal(t, d, dback)

		o := workflows.SendBatchResult{Outcomes: []workflows.BatchOutcome{{MessageID: "m", Outcome: workflows.BatchFailed, RetryAfter: time.Second}, {MessageID: "n", Outcome: workflows.BatchSent}}}
		b, err = json.Marshal(o)
		require.NoError(t, err)
		require.JSONEq(t, `{"outcomes":[{"message_id":"m","outcome":"failed","retry_after":"1s"},{"message_id":"n","outcome":"sent"}]}`, string(b))
		var oback workflows.SendBatchResult
		require.NoError(t, json.Unmarshal(b, &oback))
		require.Equal(t, o, oback)

		si := workflows.SendBatchInput{Batch: "outbox-batch-m", Topic: "clicks", SendTimeout: 30 * time.Second, Concurrency: 16, MaxAttempts: 12}
		b, err = json.Marshal(si)
		require.NoError(t, err)
		require.Contains(t, string(b), `"send_timeout":"30s"`)
		var siback workflows.SendBatchInput
		require.NoError(t, json.Unmarshal(b, &siback))
		require.Equal(t, si, siback)
	})
}
