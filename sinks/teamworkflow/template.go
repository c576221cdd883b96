package teamworkflow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	dmsg "github.com/outbox-go/outbox/delivery"
)

// WorkflowIDFields are the names a workflow_id template may use besides payload.<field>.
var WorkflowIDFields = []string{"message_id", "topic", "ordering_key"}

// CheckWorkflowIDTemplate reports a template that names a field it cannot have, or whose
// braces do not pair up. A template is text with {name} placeholders: {message_id},
// {topic}, {ordering_key} and {payload.<field>} (a dotted path into the payload's JSON
// object, such as {payload.order.id}).
func CheckWorkflowIDTemplate(tmpl string) error {
	if tmpl == "" {
		return fmt.Errorf("workflow_id template is empty")
	}
	if tmpl == "outbox-{message_id}" {
		return fmt.Errorf("workflow_id template %q is the ID of the outbox's own delivery run: the team's workflow needs an ID of its own (the default is %s)",
			tmpl, DefaultWorkflowIDTemplate)
	}
	_, err := renderTemplate(tmpl, func(name string) (string, error) {
		if strings.HasPrefix(name, "payload.") && len(name) > len("payload.") {
			return "x", nil
		}
		for _, f := range WorkflowIDFields {
			if name == f {
				return "x", nil
			}
		}
		return "", fmt.Errorf("workflow_id template %q: {%s} is not a field; use {message_id}, {topic}, {ordering_key} or {payload.<field>}", tmpl, name)
	})
	return err
}

// MaxWorkflowIDBytes is the longest workflow ID Temporal takes by default (the server's
// limit.maxIDLength, which Temporal Cloud keeps): a child workflow started with a longer
// one fails its parent's workflow task again and again instead of failing the start.
const MaxWorkflowIDBytes = 1000

// CheckWorkflowID reports a rendered workflow ID that no start can give the team's
// workflow: longer than MaxWorkflowIDBytes, or own, the ID of the delivery run that starts
// it (whose start would find itself already running and count the message delivered).
func CheckWorkflowID(tmpl, id, own string) error {
	if len(id) > MaxWorkflowIDBytes {
		return fmt.Errorf("workflow_id template %q renders an ID of %d bytes, over Temporal's limit of %d: shorten the template or the payload fields it names",
			tmpl, len(id), MaxWorkflowIDBytes)
	}
	if id == own {
		return fmt.Errorf("workflow_id template %q renders %s, the ID of the outbox's own delivery run: the team's workflow needs an ID of its own", tmpl, id)
	}
	return nil
}

// RenderWorkflowID fills a workflow_id template with the message's fields. A payload field
// that is missing, null, or not a string, number or boolean is an error that names it.
func RenderWorkflowID(tmpl string, m dmsg.Message, orderingKey string) (string, error) {
	var payload any
	decoded := false
	return renderTemplate(tmpl, func(name string) (string, error) {
		switch name {
		case "message_id":
			return m.MessageID, nil
		case "topic":
			return m.Topic, nil
		case "ordering_key":
			if orderingKey == "" {
				return "", fmt.Errorf("workflow_id template %q: message %s has no ordering key", tmpl, m.MessageID)
			}
			return orderingKey, nil
		}
		path, ok := strings.CutPrefix(name, "payload.")
		if !ok {
			return "", fmt.Errorf("workflow_id template %q: {%s} is not a field", tmpl, name)
		}
		if !decoded {
			dec := json.NewDecoder(bytes.NewReader(m.Payload))
			dec.UseNumber()
			if err := dec.Decode(&payload); err != nil {
				return "", fmt.Errorf("workflow_id template %q: the payload of message %s is not JSON: %v", tmpl, m.MessageID, err)
			}
			decoded = true
		}
		v := payload
		for _, key := range strings.Split(path, ".") {
			obj, ok := v.(map[string]any)
			if !ok {
				return "", fmt.Errorf("workflow_id template %q: the payload of message %s has no field %s", tmpl, m.MessageID, path)
			}
			if v, ok = obj[key]; !ok {
				return "", fmt.Errorf("workflow_id template %q: the payload of message %s has no field %s", tmpl, m.MessageID, path)
			}
		}
		switch v := v.(type) {
		case string:
			if v == "" {
				return "", fmt.Errorf("workflow_id template %q: field %s of the payload of message %s is empty", tmpl, path, m.MessageID)
			}
			return v, nil
		case json.Number:
			return v.String(), nil
		case bool:
			return fmt.Sprint(v), nil
		default:
			return "", fmt.Errorf("workflow_id template %q: field %s of the payload of message %s is %s, not a string, number or boolean", tmpl, path, m.MessageID, kindOf(v))
		}
	})
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	return fmt.Sprintf("%T", v)
}

// renderTemplate replaces each {name} of tmpl with value(name).
func renderTemplate(tmpl string, value func(name string) (string, error)) (string, error) {
	var b strings.Builder
	rest := tmpl
	for {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		if rest[open] == '}' {
			return "", fmt.Errorf("workflow_id template %q: a } without its {", tmpl)
		}
		b.WriteString(rest[:open])
		end := strings.IndexAny(rest[open+1:], "{}")
		if end < 0 || rest[open+1+end] != '}' {
			return "", fmt.Errorf("workflow_id template %q: a { without its }", tmpl)
		}
		v, err := value(rest[open+1 : open+1+end])
		if err != nil {
			return "", err
		}
		b.WriteString(v)
		rest = rest[open+1+end+1:]
	}
}
