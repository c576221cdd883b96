// Package teamworkflow is the team-workflow sink: a topic (workflow: and task_queue:)
// delivered by starting a team's own Temporal workflow with a delivery.Message as its
// input, or, with signal:, by signalling it (signal-with-start). The workflow's ID comes
// from a template (RenderWorkflowID), the de-duplication key: a second start with the ID
// counts as delivered. Config is the topic's settings as the delivery workflow's input
// carries them.
package teamworkflow

import (
	"cmp"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
)

// DefaultWorkflowIDTemplate is the workflow ID of a started workflow when the topic sets
// none.
const DefaultWorkflowIDTemplate = "{topic}-{message_id}"

// IDReusePolicies maps the workflow_id_reuse values to Temporal's policies.
var IDReusePolicies = map[string]enumspb.WorkflowIdReusePolicy{
	"reject_duplicate":            enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	"allow_duplicate":             enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
	"allow_duplicate_failed_only": enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
}

// Config names the team's workflow a topic starts, one per message (or per
// workflow ID: two messages whose template gives the same ID start one workflow). It is
// started as a child of the delivery with an abandon parent-close policy, so the delivery's
// history links to it and it outlives the delivery. Its input is a delivery.Message.
type Config struct {
	// Workflow is the workflow type name, such as "FulfilOrder".
	Workflow string `json:"workflow"`
	// TaskQueue is the task queue of the team's worker.
	TaskQueue string `json:"task_queue"`
	// WorkflowID is the template of the started workflow's ID (see RenderWorkflowID), the
	// de-duplication key. Defaults to DefaultWorkflowIDTemplate.
	WorkflowID string `json:"workflow_id,omitempty"`
	// IDReuse says whether a workflow may start again with the ID of a closed one:
	// "reject_duplicate" (the default without Signal: a second start counts as
	// delivered), "allow_duplicate" (the default with Signal: a new run receives the
	// signal) or "allow_duplicate_failed_only". With Signal, reject_duplicate is refused,
	// and a closed workflow that may not start again fails the message permanently.
	IDReuse string `json:"id_reuse,omitempty"`
	// Signal, when set, signals the workflow with this signal name (the delivery.Message as
	// its argument), starting it first when it is not running (signal-with-start), from the
	// signal activity. A signal is delivered at least once: the workflow de-duplicates by
	// MessageID.
	Signal string `json:"signal,omitempty"`
}

// WithDefaults returns c with its defaults filled: the workflow ID template, and the ID
// reuse policy (allow_duplicate with a signal, reject_duplicate without).
func (c Config) WithDefaults() Config {
	c.WorkflowID = cmp.Or(c.WorkflowID, DefaultWorkflowIDTemplate)
	// A signal goes to a workflow that lives across messages: once it closed, only a new
	// run can receive the next message.
	c.IDReuse = cmp.Or(c.IDReuse, map[bool]string{true: "allow_duplicate", false: "reject_duplicate"}[c.Signal != ""])
	return c
}

// Validate reports the first setting of c (after WithDefaults) that is wrong.
func (c Config) Validate() error {
	if _, ok := IDReusePolicies[c.IDReuse]; !ok {
		return fmt.Errorf("workflow_id_reuse must be reject_duplicate, allow_duplicate or allow_duplicate_failed_only, got %q", c.IDReuse)
	}
	switch {
	case c.Signal != "" && c.IDReuse == "reject_duplicate":
		return fmt.Errorf("workflow_id_reuse reject_duplicate cannot go with signal %s: once workflow %s closed, every later message of its ID would be delivered to no one; use allow_duplicate (the default for signals: a new run receives the signal) or allow_duplicate_failed_only", c.Signal, c.Workflow)
	case c.Workflow == "":
		return fmt.Errorf("workflow must name the workflow type, got an empty name")
	case c.TaskQueue == "":
		return fmt.Errorf("task_queue must name the task queue of workflow %s, got an empty name", c.Workflow)
	}
	return CheckWorkflowIDTemplate(c.WorkflowID)
}
