// Package teamnexus is the Nexus sink: a topic (nexus: endpoint, service, operation)
// delivered as an operation of a Nexus service that a team serves from its own namespace,
// which is how Temporal crosses team boundaries. The delivery workflow calls the
// operation through the endpoint once per attempt, with a delivery.Message as its input;
// each attempt is one Nexus operation in the delivery's history. The team serves a
// delivery.Handler as that operation with Operation (and a delivery.Checker as its
// check_operation with CheckOperation), so that its errors mean what they mean for every
// other sink. Config is the topic's settings as the workflow's input carries them.
package teamnexus

import (
	"cmp"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outbox-go/outbox/internal/textduration"
)

// Config names a topic's Nexus operation. The JSON names are those of the delivery
// workflow's input.
type Config struct {
	// Endpoint is the Nexus endpoint's name, as created with `temporal operator nexus
	// endpoint create` (its target is the handler's namespace and task queue). Required.
	Endpoint string `json:"endpoint"`
	// Service is the Nexus service's name, as the handler's worker registers it. Required.
	Service string `json:"service"`
	// Operation is the operation's name within Service. Its input is a delivery.Message.
	// Required.
	Operation string `json:"operation"`
	// CheckOperation, when set, is an operation of the same service that answers whether
	// the team already processed the message: a delivery.Message in, a bool out.
	CheckOperation string `json:"check_operation,omitempty"`
	// Timeout bounds one attempt (the operation's schedule-to-close timeout): running out
	// (the handler is down, or slower) is an ambiguous failure, so CheckOperation is
	// asked before the next attempt. Defaults to the topic's send timeout.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// WithDefaults returns c with its defaults filled; sendTimeout is the topic's.
func (c Config) WithDefaults(sendTimeout time.Duration) Config {
	c.Timeout = cmp.Or(c.Timeout, sendTimeout)
	return c
}

// Validate reports the first setting of c (after WithDefaults) that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Endpoint == "":
		return fmt.Errorf("nexus.endpoint must name the Nexus endpoint, got an empty name")
	case c.Service == "":
		return fmt.Errorf("nexus.service must name the Nexus service behind endpoint %s, got an empty name", c.Endpoint)
	case c.Operation == "":
		return fmt.Errorf("nexus.operation must name the operation of service %s, got an empty name", c.Service)
	case c.Operation == c.CheckOperation:
		return fmt.Errorf("nexus.check_operation must differ from nexus.operation (%s): it answers whether the operation already ran", c.Operation)
	case c.Timeout <= 0:
		return fmt.Errorf("nexus.timeout must be positive, got %s", c.Timeout)
	}
	return nil
}

// String names the operation as the delivery's history does: endpoint/service/operation.
func (c Config) String() string { return c.Endpoint + "/" + c.Service + "/" + c.Operation }

// configJSON is Config as JSON, its timeout as text.
type configJSON struct {
	Endpoint       string                `json:"endpoint"`
	Service        string                `json:"service"`
	Operation      string                `json:"operation"`
	CheckOperation string                `json:"check_operation,omitempty"`
	Timeout        textduration.Duration `json:"timeout,omitempty"`
}

// MarshalJSON writes c with its timeout as text.
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(configJSON{
		Endpoint: c.Endpoint, Service: c.Service, Operation: c.Operation, CheckOperation: c.CheckOperation,
		Timeout: textduration.Duration(c.Timeout),
	})
}

// UnmarshalJSON reads c with its timeout as text or as integer nanoseconds.
func (c *Config) UnmarshalJSON(b []byte) error {
	var j configJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("nexus handler: %w", err)
	}
	*c = Config{
		Endpoint: j.Endpoint, Service: j.Service, Operation: j.Operation, CheckOperation: j.CheckOperation,
		Timeout: time.Duration(j.Timeout),
	}
	return nil
}
