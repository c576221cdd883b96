package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-go/outbox/delivery"
)

func messages(n int) []delivery.Message {
	out := make([]delivery.Message, n)
	for i := range out {
		out[i] = delivery.Message{MessageID: fmt.Sprint(i), Topic: "t"}
	}
	return out
}

func TestSendAllSendsEachAtMostConcurrencyAtOnce(t *testing.T) {
	var running, most atomic.Int32
	h := delivery.HandlerFunc(func(ctx context.Context, m delivery.Message) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			old := most.Load()
			if n <= old || most.CompareAndSwap(old, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		switch m.MessageID {
		case "3":
			return delivery.Permanent(errors.New("rejected"))
		case "5":
			panic("boom")
		case "7":
			<-ctx.Done() // runs out its own time only
			return ctx.Err()
		}
		return nil
	})
	errs := delivery.SendAll(context.Background(), h, messages(20), 4, 50*time.Millisecond)
	if len(errs) != 20 {
		t.Fatalf("%d answers for 20 messages", len(errs))
	}
	for i, err := range errs {
		switch i {
		case 3:
			if !delivery.IsPermanent(err) {
				t.Errorf("message 3: %v, want a permanent failure", err)
			}
		case 5, 7:
			if !delivery.IsAmbiguous(err) {
				t.Errorf("message %d: %v, want an ambiguous failure", i, err)
			}
		default:
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		}
	}
	if most.Load() > 4 {
		t.Errorf("%d sends at once, want at most 4", most.Load())
	}
}

type batchOnly struct{ answers []error }

func (b batchOnly) Send(context.Context, delivery.Message) error {
	return errors.New("Send was called")
}
func (b batchOnly) SendBatch(_ context.Context, msgs []delivery.Message) []error {
	return b.answers
}

func TestSendAllUsesSendBatch(t *testing.T) {
	rejected := delivery.Retryable(errors.New("full"), time.Second)
	errs := delivery.SendAll(context.Background(), batchOnly{answers: []error{nil, rejected}}, messages(3), 4, 0)
	if errs[0] != nil || !errors.Is(errs[1], rejected) {
		t.Fatalf("answers %v, want nil and the handler's failure", errs)
	}
	if !delivery.IsAmbiguous(errs[2]) {
		t.Errorf("a message the batch handler did not answer for: %v, want ambiguous", errs[2])
	}
	if delivery.SendAll(context.Background(), batchOnly{}, nil, 4, 0) != nil {
		t.Error("no messages, no answers")
	}
}

func TestSendAllLeavesWhatItHadNoTimeForUnsent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	var sent atomic.Int32
	h := delivery.HandlerFunc(func(ctx context.Context, m delivery.Message) error {
		sent.Add(1)
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	errs := delivery.SendAll(ctx, h, messages(10), 1, 0)
	var notSent int
	for _, err := range errs {
		if errors.Is(err, delivery.ErrNotAttempted) {
			notSent++
			if _, ok := delivery.IsRetryable(err); !ok {
				t.Errorf("%v: want retryable", err)
			}
		}
	}
	if int(sent.Load())+notSent != 10 || notSent == 0 {
		t.Errorf("%d sent and %d not sent of 10, want some of each", sent.Load(), notSent)
	}
}
