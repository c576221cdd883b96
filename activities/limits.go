package activities

import (
	"fmt"

	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// sendHandler is the handler of the row's topic, for a send: it also refuses a payload
// larger than the store's limit. Enqueue enforces the limit, but a row inserted with plain
// SQL can hold a jsonb payload of any size; sending it would push it to the downstream
// (and, for a handler hosted as an activity, into the workflow history), so it is a
// permanent failure that dead-letters the message with the size and the limit.
func (a *Activities) sendHandler(row store.Row) (delivery.Handler, error) {
	h, err := a.handler(row)
	if err != nil {
		return nil, err
	}
	if err := checkPayloadSize(row, a.Store.MaxPayloadBytes()); err != nil {
		return nil, err
	}
	return h, nil
}

// checkPayloadSize returns a non-retryable ErrTypePermanent error when the row's payload
// is larger than limit bytes. It is measured without the whitespace the database prints
// between tokens (store.PayloadSize), so every payload Enqueue accepted is within it.
func checkPayloadSize(row store.Row, limit int) error {
	if n := store.PayloadSize(row.Payload); n > limit {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("payload of message %s is %d bytes without whitespace, over the payload size limit of %d bytes (max_payload_bytes); it was inserted without Enqueue's check",
				row.MessageID, n, limit),
			workflows.ErrTypePermanent, nil)
	}
	return nil
}

// checkEncodedSize returns a non-retryable ErrTypePermanent error when the row's payload,
// as Temporal's JSON encoding carries it to a team's activity, workflow or Nexus
// operation, is larger than store.HardMaxPayloadBytes. Each <, > and & takes six bytes
// there, so a payload within the limit can still be one that Temporal refuses: the run
// would then fail at every try without delivering or dead-lettering the message.
//
// Headers over store.MaxHeadersBytes (a row inserted without Enqueue's check) are refused
// too: the room Temporal's limit leaves beside the payload is for the rest of the input,
// headers of Enqueue's size among it.
func checkEncodedSize(row store.Row) error {
	if n := store.HeadersSize(row.Headers); n > store.MaxHeadersBytes {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("headers of message %s are %d bytes of keys and values, over the %d bytes a message's headers may take; it was inserted without Enqueue's check",
				row.MessageID, n, store.MaxHeadersBytes),
			workflows.ErrTypePermanent, nil)
	}
	if n := store.EncodedPayloadSize(row.Payload); n > store.HardMaxPayloadBytes {
		return temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("payload of message %s is %d bytes as Temporal's JSON encoding carries it to a team's handler (each <, > and & escaped to 6 bytes), "+
				"over the %d bytes a payload may take there; a topic with an HTTP or broker sink can deliver it",
				row.MessageID, n, store.HardMaxPayloadBytes),
			workflows.ErrTypePermanent, nil)
	}
	return nil
}
