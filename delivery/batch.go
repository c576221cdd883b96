package delivery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// BatchHandler is a Handler that can deliver many messages of one topic at once: a
// broker's batch publish, each message with its own idempotency key. The batch lane (a
// topic with lane: batch) hands it a batch's messages together; a Handler without it has
// them sent with Send, several at a time (see SendAll).
type BatchHandler interface {
	Handler
	// SendBatch delivers msgs, all of one topic, and returns one error per message in
	// the order of msgs: nil for a message the downstream has, and for one it does not
	// (or may not) have an error marked as Send's would be. A message that fails takes
	// no other with it: each is retried, checked or dead-lettered on its own.
	SendBatch(ctx context.Context, msgs []Message) []error
}

// ErrNotAttempted marks a message of a batch that SendAll did not send: ctx ended before
// its turn came. Nothing went out for it; SendAll reports it Retryable, wrapping this.
var ErrNotAttempted = errors.New("not sent: the batch's time ran out before its turn")

// SendAll delivers msgs with h and returns one error per message, in order: with
// h.SendBatch when h is a BatchHandler, else with h.Send for each message, at most
// concurrency at once (at least one), each bounded by perMessage when it is positive. A
// message whose turn comes after ctx ended is not sent (a Retryable error wrapping
// ErrNotAttempted). A BatchHandler that answers for fewer messages than it was given
// leaves the others ambiguous: they may have been sent. A Send that panics fails its
// message as ambiguous.
func SendAll(ctx context.Context, h Handler, msgs []Message, concurrency int, perMessage time.Duration) []error {
	if len(msgs) == 0 {
		return nil
	}
	if b, ok := h.(BatchHandler); ok {
		errs := b.SendBatch(ctx, msgs)
		out := make([]error, len(msgs))
		for i := range out {
			if i < len(errs) {
				out[i] = errs[i]
			} else {
				out[i] = Ambiguous(fmt.Errorf("the batch handler gave no answer for message %s", msgs[i].MessageID))
			}
		}
		return out
	}
	errs := make([]error, len(msgs))
	sem := make(chan struct{}, max(concurrency, 1))
	var wg sync.WaitGroup
	for i, m := range msgs {
		sem <- struct{}{}
		if err := ctx.Err(); err != nil {
			<-sem
			errs[i] = Retryable(fmt.Errorf("message %s: %w (%w)", m.MessageID, ErrNotAttempted, context.Cause(ctx)), 0)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer func() {
				// A panic here would end the process: it is this message's failure alone.
				if r := recover(); r != nil {
					errs[i] = Ambiguous(fmt.Errorf("handler panicked on message %s: %v", m.MessageID, r))
				}
			}()
			sendCtx, cancel := ctx, context.CancelFunc(func() {})
			if perMessage > 0 {
				sendCtx, cancel = context.WithTimeout(ctx, perMessage)
			}
			defer cancel()
			errs[i] = h.Send(sendCtx, m)
		})
	}
	wg.Wait()
	return errs
}
