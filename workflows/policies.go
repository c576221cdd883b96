package workflows

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Policies is the delivery policy of every topic of one configuration: Topics by name,
// and Default for every other topic. It is the document a relay or a worker publishes
// (storedriver.PublishedPolicy) so that every relay of the outbox freezes the newest
// configuration's policy into the runs it starts.
type Policies struct {
	Default Policy            `json:"default"`
	Topics  map[string]Policy `json:"topics,omitempty"`
}

// For returns the policy of topic: its own, else Default.
func (p Policies) For(topic string) Policy {
	if t, ok := p.Topics[topic]; ok {
		return t
	}
	return p.Default
}

// Validate reports the first policy of p that is out of range, naming its topic.
func (p Policies) Validate() error {
	if err := p.Default.WithDefaults().Validate(); err != nil {
		return fmt.Errorf("default policy: %w", err)
	}
	for _, topic := range slices.Sorted(maps.Keys(p.Topics)) {
		if err := p.Topics[topic].WithDefaults().Validate(); err != nil {
			return fmt.Errorf("policy of topic %s: %w", topic, err)
		}
	}
	return nil
}

// Differ lists, in order, the topics whose policy differs between p and q (both taken
// with defaults), "(default)" standing for the default policy.
func (p Policies) Differ(q Policies) []string {
	var out []string
	names := maps.Clone(p.Topics)
	if names == nil {
		names = map[string]Policy{}
	}
	maps.Copy(names, q.Topics)
	for _, topic := range slices.Sorted(maps.Keys(names)) {
		if !samePolicy(p.For(topic), q.For(topic)) {
			out = append(out, topic)
		}
	}
	if !samePolicy(p.Default, q.Default) {
		out = append(out, "(default)")
	}
	return out
}

func samePolicy(a, b Policy) bool {
	ja, errA := json.Marshal(a.WithDefaults())
	jb, errB := json.Marshal(b.WithDefaults())
	return errA == nil && errB == nil && string(ja) == string(jb)
}
