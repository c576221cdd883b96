package workflows

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// The inputs of the workflows write their durations as text ("1s", "1m30s"), so that the
// Temporal UI shows a history's input as a person reads it. Histories recorded before that
// hold nanosecond integers; both forms are read, so those histories still replay.

// textDuration is a time.Duration in JSON: written as text, read from text or from an
// integer number of nanoseconds.
type textDuration time.Duration

func (d textDuration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *textDuration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration must be text such as \"1s\" or \"1m30s\", got %q", s)
		}
		*d = textDuration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("duration must be text such as \"1s\" or integer nanoseconds, got %s", b)
	}
	*d = textDuration(n)
	return nil
}

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
	}
	if j.MarkSentTimeout != nil {
		p.MarkSentTimeout = time.Duration(*j.MarkSentTimeout)
	}
	return nil
}

// activityHandlerJSON is ActivityHandler as JSON, its durations as text.
type activityHandlerJSON struct {
	Activity        string       `json:"activity"`
	TaskQueue       string       `json:"task_queue"`
	StartToClose    textDuration `json:"start_to_close,omitempty"`
	ScheduleToStart textDuration `json:"schedule_to_start,omitempty"`
	CheckActivity   string       `json:"check_activity,omitempty"`
}

// MarshalJSON writes a with its durations as text.
func (a ActivityHandler) MarshalJSON() ([]byte, error) {
	return json.Marshal(activityHandlerJSON{
		Activity: a.Activity, TaskQueue: a.TaskQueue, CheckActivity: a.CheckActivity,
		StartToClose: textDuration(a.StartToClose), ScheduleToStart: textDuration(a.ScheduleToStart),
	})
}

// UnmarshalJSON reads a with its durations as text or as integer nanoseconds.
func (a *ActivityHandler) UnmarshalJSON(b []byte) error {
	var j activityHandlerJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("activity handler: %w", err)
	}
	*a = ActivityHandler{
		Activity: j.Activity, TaskQueue: j.TaskQueue, CheckActivity: j.CheckActivity,
		StartToClose: time.Duration(j.StartToClose), ScheduleToStart: time.Duration(j.ScheduleToStart),
	}
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
