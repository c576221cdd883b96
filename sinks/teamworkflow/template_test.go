package teamworkflow_test

import (
	"encoding/json"
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
		"{order_id}": "{order_id} is not a field",
		"x-{payload": "a { without its }",
		"x}":         "a } without its {",
		"":           "workflow_id template is empty",
	} {
		require.ErrorContains(t, teamworkflow.CheckWorkflowIDTemplate(tmpl), want, tmpl)
	}
}
