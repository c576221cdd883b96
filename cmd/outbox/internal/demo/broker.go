package demo

import (
	"github.com/outbox-go/outbox/config"
)

// The demo's broker topic: each order also announces itself on NATS JetStream, on the
// subject demo.order.placed of the stream DemoStream.
const (
	TopicOrderPlaced = "order.placed"
	DemoStream       = "OUTBOX_DEMO"
	DemoSubjects     = "demo.>"
)

// BrokerTopics returns the config of the demo's broker topic, published to the NATS
// server at natsURL.
func BrokerTopics(natsURL string) map[string]config.Topic {
	return map[string]config.Topic{
		TopicOrderPlaced: {Sink: "nats", URL: natsURL, Subject: "demo.{topic}"},
	}
}
