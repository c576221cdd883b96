// Package teamactivity is the team-activity sink: a topic (activity: and task_queue:)
// delivered by a team's own Temporal activity, on the team's task queue, instead of by a
// handler in the outbox's worker. The delivery workflow executes the activity by name
// once per attempt, with a delivery.Message as its input; the team registers a
// delivery.Handler as that activity with teamactivity.Activity (and a delivery.Checker as
// its check_activity with teamactivity.CheckActivity), so that its errors mean what they
// mean for every other sink. Config is the topic's settings as the workflow's input
// carries them.
package teamactivity

import (
	"cmp"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outbox-go/outbox/internal/textduration"
)

// DefaultScheduleToStart is how long an attempt may wait for a worker when
// Config.ScheduleToStart is zero.
const DefaultScheduleToStart = 5 * time.Minute

// Config names a topic's activity, registered by a team's worker on its own task queue.
// Its input is a delivery.Message. The JSON names are those of the delivery workflow's
// input.
type Config struct {
	// Activity is the activity type name, such as "ReserveStock". Required.
	Activity string `json:"activity"`
	// TaskQueue is the task queue the team's worker polls. Required.
	TaskQueue string `json:"task_queue"`
	// StartToClose bounds one attempt once a worker has started it; running out is an
	// ambiguous failure (the check activity is asked before the next attempt). Defaults to
	// the topic's send timeout.
	StartToClose time.Duration `json:"start_to_close,omitempty"`
	// ScheduleToStart bounds the wait for a worker to pick an attempt up; running out is
	// a retryable failure (nothing ran). Defaults to DefaultScheduleToStart.
	ScheduleToStart time.Duration `json:"schedule_to_start,omitempty"`
	// CheckActivity, when set, is an activity on the same task queue that answers whether
	// the team already processed the message: (processed bool, err error).
	CheckActivity string `json:"check_activity,omitempty"`
}

// WithDefaults returns c with its defaults filled; sendTimeout is the topic's.
func (c Config) WithDefaults(sendTimeout time.Duration) Config {
	c.StartToClose = cmp.Or(c.StartToClose, sendTimeout)
	c.ScheduleToStart = cmp.Or(c.ScheduleToStart, DefaultScheduleToStart)
	return c
}

// Validate reports the first setting of c (after WithDefaults) that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Activity == "":
		return fmt.Errorf("activity must name the activity type, got an empty name")
	case c.TaskQueue == "":
		return fmt.Errorf("task_queue must name the task queue of activity %s, got an empty name", c.Activity)
	case c.StartToClose <= 0:
		return fmt.Errorf("start_to_close must be positive, got %s", c.StartToClose)
	case c.ScheduleToStart <= 0:
		return fmt.Errorf("schedule_to_start must be positive, got %s", c.ScheduleToStart)
	}
	return nil
}

// configJSON is Config as JSON, its durations as text.
type configJSON struct {
	Activity        string                `json:"activity"`
	TaskQueue       string                `json:"task_queue"`
	StartToClose    textduration.Duration `json:"start_to_close,omitempty"`
	ScheduleToStart textduration.Duration `json:"schedule_to_start,omitempty"`
	CheckActivity   string                `json:"check_activity,omitempty"`
}

// MarshalJSON writes a with its durations as text.
func (a Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(configJSON{
		Activity: a.Activity, TaskQueue: a.TaskQueue, CheckActivity: a.CheckActivity,
		StartToClose: textduration.Duration(a.StartToClose), ScheduleToStart: textduration.Duration(a.ScheduleToStart),
	})
}

// UnmarshalJSON reads a with its durations as text or as integer nanoseconds.
func (a *Config) UnmarshalJSON(b []byte) error {
	var j configJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("activity handler: %w", err)
	}
	*a = Config{
		Activity: j.Activity, TaskQueue: j.TaskQueue, CheckActivity: j.CheckActivity,
		StartToClose: time.Duration(j.StartToClose), ScheduleToStart: time.Duration(j.ScheduleToStart),
	}
	return nil
}
