package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Disagreement is a topic for which two configurations would deliver differently: the
// relay's file freezes the delivery policy into each run it starts, and the worker's file
// builds the handlers, so a relay and a worker that read different files can disagree.
type Disagreement struct {
	// Topic is the topic, or DefaultTopic for the default entry.
	Topic string
	// What names the difference: "policy", "ordering" or "handler".
	What string
	// A and B describe the topic under each configuration.
	A, B string
}

// DefaultTopic is how a Disagreement names the default entry: no topic can be called
// that.
const DefaultTopic = "(default)"

func (d Disagreement) String() string {
	return fmt.Sprintf("topic %s: %s differs: %s vs %s", d.Topic, d.What, d.A, d.B)
}

// Compare reports each topic, of either configuration or the default entry, that a and
// b (both after WithDefaults) would deliver differently: its delivery policy (attempts,
// backoff, timeouts, first attempt, a team's activity or workflow: what the relay freezes
// into a run, decided by Topic.Policy for both), its ordering settings (the claim's), or
// who delivers it (a sink of the outbox's worker, and which kind, or no handler at all).
// The secrets and the sinks' own settings (url, subject, ...) may differ between
// processes and are not compared.
func Compare(a, b *Config) []Disagreement {
	names := map[string]bool{}
	for n := range a.Topics {
		names[n] = true
	}
	for n := range b.Topics {
		names[n] = true
	}
	topics := slices.Sorted(maps.Keys(names))
	if a.Default != nil || b.Default != nil {
		topics = append(topics, DefaultTopic)
	}
	var out []Disagreement
	for _, topic := range topics {
		ta, oka := a.entry(topic)
		tb, okb := b.entry(topic)
		if pa, pb := policyText(ta), policyText(tb); pa != pb {
			out = append(out, Disagreement{Topic: topic, What: "policy", A: pa, B: pb})
		}
		if oa, ob := orderingText(ta), orderingText(tb); oa != ob {
			out = append(out, Disagreement{Topic: topic, What: "ordering", A: oa, B: ob})
		}
		if ha, hb := handlerText(ta, oka), handlerText(tb, okb); ha != hb {
			out = append(out, Disagreement{Topic: topic, What: "handler", A: ha, B: hb})
		}
	}
	return out
}

// entry returns the configuration that serves topic (DefaultTopic: the default entry).
func (c *Config) entry(topic string) (Topic, bool) {
	if topic == DefaultTopic {
		if c.Default == nil {
			return Topic{}, false
		}
		return *c.Default, true
	}
	return c.TopicConfig(topic)
}

func policyText(t Topic) string {
	b, err := json.Marshal(t.Policy())
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func orderingText(t Topic) string {
	isOn := func(b *bool) bool { return b == nil || *b }
	return fmt.Sprintf("ordering=%t dead_letter_blocks_key=%t", isOn(t.Ordering), isOn(t.DeadLetterBlocksKey))
}

func handlerText(t Topic, ok bool) string {
	switch {
	case !ok:
		return "no entry (no handler, no default)"
	case t.Nexus.set():
		return "Nexus operation " + t.nexusHandler().String()
	case t.Activity != "":
		return "activity " + t.Activity + " on task queue " + t.TaskQueue
	case t.Workflow != "":
		return "workflow " + t.Workflow + " on task queue " + t.TaskQueue
	case t.Sink == "":
		return "sink http"
	default:
		return "sink " + t.Sink
	}
}
