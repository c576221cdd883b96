package workflows

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/outbox-go/outbox/internal/textduration"
)

// The inputs of the workflows write their durations as text ("1s", "1m30s"), so that the
// Temporal UI shows a history's input as a person reads it. Histories recorded before that
// hold nanosecond integers; both forms are read, so those histories still replay.

// textDuration is a time.Duration in JSON, written as text (see package
// internal/textduration).
type textDuration = textduration.Duration

// policyJSON is Policy as JSON.
type policyJSON struct {
	MaxAttempts        int              `json:"max_attempts"`
	InitialInterval    textDuration     `json:"initial_interval"`
	BackoffCoefficient float64          `json:"backoff_coefficient"`
	MaxInterval        textDuration     `json:"max_interval"`
	SendTimeout        textDuration     `json:"send_timeout"`
	MarkSentTimeout    *textDuration    `json:"mark_sent_timeout,omitempty"`
	FirstAttempt       string           `json:"first_attempt,omitempty"`
	Activity           *ActivityHandler `json:"activity,omitempty"`
	Workflow           *WorkflowHandler `json:"workflow,omitempty"`
	Nexus              *NexusHandler    `json:"nexus,omitempty"`
	Batch              *BatchPolicy     `json:"batch,omitempty"`
}

// MarshalJSON writes p with its durations as text.
func (p Policy) MarshalJSON() ([]byte, error) {
	j := policyJSON{
		MaxAttempts:        p.MaxAttempts,
		InitialInterval:    textDuration(p.InitialInterval),
		BackoffCoefficient: p.BackoffCoefficient,
		MaxInterval:        textDuration(p.MaxInterval),
		SendTimeout:        textDuration(p.SendTimeout),
		FirstAttempt:       p.FirstAttempt,
		Activity:           p.Activity,
		Workflow:           p.Workflow,
		Nexus:              p.Nexus,
		Batch:              p.Batch,
	}
	if p.MarkSentTimeout != 0 {
		t := textDuration(p.MarkSentTimeout)
		j.MarkSentTimeout = &t
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads p with its durations as text or as integer nanoseconds.
func (p *Policy) UnmarshalJSON(b []byte) error {
	var j policyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("delivery policy: %w", err)
	}
	*p = Policy{
		MaxAttempts:        j.MaxAttempts,
		InitialInterval:    time.Duration(j.InitialInterval),
		BackoffCoefficient: j.BackoffCoefficient,
		MaxInterval:        time.Duration(j.MaxInterval),
		SendTimeout:        time.Duration(j.SendTimeout),
		FirstAttempt:       j.FirstAttempt,
		Activity:           j.Activity,
		Workflow:           j.Workflow,
		Nexus:              j.Nexus,
		Batch:              j.Batch,
	}
	if j.MarkSentTimeout != nil {
		p.MarkSentTimeout = time.Duration(*j.MarkSentTimeout)
	}
	return nil
}

// The batch lane's types write their durations as text too: each MarshalJSON shadows the
// duration field of the plain struct with its text form.

// MarshalJSON writes b with its wait as text.
func (b BatchPolicy) MarshalJSON() ([]byte, error) {
	type plain BatchPolicy
	return json.Marshal(struct {
		plain
		Wait textDuration `json:"wait"`
	}{plain(b), textDuration(b.Wait)})
}

// UnmarshalJSON reads b with its wait as text or as integer nanoseconds.
func (b *BatchPolicy) UnmarshalJSON(data []byte) error {
	type plain BatchPolicy
	var j struct {
		plain
		Wait textDuration `json:"wait"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("batch policy: %w", err)
	}
	*b = BatchPolicy(j.plain)
	b.Wait = time.Duration(j.Wait)
	return nil
}

// MarshalJSON writes p with its retry-after as text.
func (p PriorAttempt) MarshalJSON() ([]byte, error) {
	type plain PriorAttempt
	return json.Marshal(struct {
		plain
		RetryAfter textDuration `json:"retry_after,omitempty"`
	}{plain(p), textDuration(p.RetryAfter)})
}

// UnmarshalJSON reads p with its retry-after as text or as integer nanoseconds.
func (p *PriorAttempt) UnmarshalJSON(data []byte) error {
	type plain PriorAttempt
	var j struct {
		plain
		RetryAfter textDuration `json:"retry_after,omitempty"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("prior attempt: %w", err)
	}
	*p = PriorAttempt(j.plain)
	p.RetryAfter = time.Duration(j.RetryAfter)
	return nil
}

// MarshalJSON writes o with its retry-after as text.
func (o BatchOutcome) MarshalJSON() ([]byte, error) {
	type plain BatchOutcome
	return json.Marshal(struct {
		plain
		RetryAfter textDuration `json:"retry_after,omitempty"`
	}{plain(o), textDuration(o.RetryAfter)})
}

// UnmarshalJSON reads o with its retry-after as text or as integer nanoseconds.
func (o *BatchOutcome) UnmarshalJSON(data []byte) error {
	type plain BatchOutcome
	var j struct {
		plain
		RetryAfter textDuration `json:"retry_after,omitempty"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("batch outcome: %w", err)
	}
	*o = BatchOutcome(j.plain)
	o.RetryAfter = time.Duration(j.RetryAfter)
	return nil
}

// MarshalJSON writes in with its send timeout as text.
func (in SendBatchInput) MarshalJSON() ([]byte, error) {
	type plain SendBatchInput
	return json.Marshal(struct {
		plain
		SendTimeout textDuration `json:"send_timeout"`
	}{plain(in), textDuration(in.SendTimeout)})
}

// UnmarshalJSON reads in with its send timeout as text or as integer nanoseconds.
func (in *SendBatchInput) UnmarshalJSON(data []byte) error {
	type plain SendBatchInput
	var j struct {
		plain
		SendTimeout textDuration `json:"send_timeout"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("send-batch input: %w", err)
	}
	*in = SendBatchInput(j.plain)
	in.SendTimeout = time.Duration(j.SendTimeout)
	return nil
}

// retentionInputJSON is RetentionInput as JSON.
type retentionInputJSON struct {
	SentAfter      textDuration     `json:"sent_after"`
	DiscardedAfter textDuration     `json:"discarded_after"`
	Archive        bool             `json:"archive"`
	BatchSize      int              `json:"batch_size"`
	MaxBatches     int              `json:"max_batches,omitempty"`
	Previous       *RetentionResult `json:"previous,omitempty"`
}

// MarshalJSON writes in with its durations as text.
func (in RetentionInput) MarshalJSON() ([]byte, error) {
	return json.Marshal(retentionInputJSON{
		SentAfter:      textDuration(in.SentAfter),
		DiscardedAfter: textDuration(in.DiscardedAfter),
		Archive:        in.Archive,
		BatchSize:      in.BatchSize,
		MaxBatches:     in.MaxBatches,
		Previous:       in.Previous,
	})
}

// UnmarshalJSON reads in with its durations as text or as integer nanoseconds.
func (in *RetentionInput) UnmarshalJSON(b []byte) error {
	var j retentionInputJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("retention input: %w", err)
	}
	*in = RetentionInput{
		SentAfter:      time.Duration(j.SentAfter),
		DiscardedAfter: time.Duration(j.DiscardedAfter),
		Archive:        j.Archive,
		BatchSize:      j.BatchSize,
		MaxBatches:     j.MaxBatches,
		Previous:       j.Previous,
	}
	return nil
}
