package workflows

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPoliciesRoundTrip: the published document reads back as the same policies, and a
// policy out of range is named with its topic.
func TestPoliciesRoundTrip(t *testing.T) {
	p := Policies{
		Default: Policy{MaxAttempts: 5}.WithDefaults(),
		Topics: map[string]Policy{
			"orders":  Policy{MaxAttempts: 3, InitialInterval: 250 * time.Millisecond, BackoffCoefficient: 1.5}.WithDefaults(),
			"refunds": Policy{Activity: &ActivityHandler{Activity: "Refund", TaskQueue: "payments"}}.WithDefaults(),
		},
	}
	doc, err := json.Marshal(p)
	require.NoError(t, err)
	var back Policies
	require.NoError(t, json.Unmarshal(doc, &back))
	require.Equal(t, p, back)
	require.NoError(t, back.Validate())
	require.Empty(t, p.Differ(back))
	require.Equal(t, 3, back.For("orders").MaxAttempts)
	require.Equal(t, 5, back.For("shipping").MaxAttempts)

	back.Topics["orders"] = Policy{MaxAttempts: 500}
	require.EqualError(t, back.Validate(), "policy of topic orders: max_attempts must be between 1 and 101, got 500")
	back.Default.FirstAttempt = "eventually"
	require.EqualError(t, back.Validate(), `default policy: first_attempt must be local or activity, got "eventually"`)
}

// A negative mark_sent_timeout is refused from Go as from the config file: it would be the
// mark-sent step's schedule-to-close timeout.
func TestPolicyRefusesANegativeMarkSentTimeout(t *testing.T) {
	err := Policy{MarkSentTimeout: -time.Second}.WithDefaults().Validate()
	require.ErrorContains(t, err, "mark_sent_timeout must not be negative")
	require.NoError(t, Policy{}.WithDefaults().Validate())
}
