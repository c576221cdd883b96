package teamworkflow_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/sinks/teamworkflow"
)

func TestWorkflowIDTemplate(t *testing.T) {
	t.Parallel()
	m := delivery.Message{MessageID: "m-1", Topic: "order.created", Payload: json.RawMessage(`{"order_id": 42, "customer": {"id": "c-7"}, "vip": true, "note": null, "tags": []}`)}
	for tmpl, want := range map[string]string{
		"fulfil-{payload.order_id}":            "fulfil-42",
		"{topic}/{message_id}":                 "order.created/m-1",
		"{payload.customer.id}-{ordering_key}": "c-7-key-1",
		"vip-{payload.vip}":                    "vip-true",
		"no placeholders":                      "no placeholders",
	} {
		got, err := teamworkflow.RenderWorkflowID(tmpl, m, "key-1")
		require.NoError(t, err, tmpl)
		require.Equal(t, want, got, tmpl)
		require.NoError(t, teamworkflow.CheckWorkflowIDTemplate(tmpl))
	}
	for tmpl, want := range map[string]string{
		"fulfil-{payload.order}":      "has no field order",
		"fulfil-{payload.order_id.x}": "has no field order_id.x",
		"{payload.note}":              "is null, not a string, number or boolean",
		"{payload.tags}":              "is an array, not a string, number or boolean",
	} {
		_, err := teamworkflow.RenderWorkflowID(tmpl, m, "")
		require.ErrorContains(t, err, want, tmpl)
	}
	_, err := teamworkflow.RenderWorkflowID("{ordering_key}", m, "")
	require.ErrorContains(t, err, "message m-1 has no ordering key")
	for tmpl, want := range map[string]string{
		"{order_id}":          "{order_id} is not a field",
		"x-{payload":          "a { without its }",
		"x}":                  "a } without its {",
		"":                    "workflow_id template is empty",
		"outbox-{message_id}": `workflow_id template "outbox-{message_id}" is the ID of the outbox's own delivery run`,
	} {
		require.ErrorContains(t, teamworkflow.CheckWorkflowIDTemplate(tmpl), want, tmpl)
	}

	// A rendered ID no start can take: over Temporal's limit (in bytes), or the delivery
	// run's own.
	require.NoError(t, teamworkflow.CheckWorkflowID("t", strings.Repeat("é", 500), "outbox-1"))
	require.ErrorContains(t, teamworkflow.CheckWorkflowID("t", strings.Repeat("é", 501), "outbox-1"), "renders an ID of 1002 bytes, over Temporal's limit of 1000")
	require.ErrorContains(t, teamworkflow.CheckWorkflowID("{payload.ref}", "outbox-1", "outbox-1"), `"{payload.ref}" renders outbox-1, the ID of the outbox's own delivery run`)
}
