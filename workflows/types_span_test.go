package workflows

import (
	"testing"
	"time"
)

func TestRetrySpanOfTheDefaultPolicy(t *testing.T) {
	// 12 attempts of up to 30s, and waits of 1s, 2s, ... 256s, then 300s twice.
	want := 12*30*time.Second + (1+2+4+8+16+32+64+128+256+300+300)*time.Second
	if got := (Policy{}).RetrySpan(); got != want {
		t.Fatalf("RetrySpan of the defaults = %s, want %s", got, want)
	}
	if got := (Policy{MaxAttempts: 1, SendTimeout: time.Second}).RetrySpan(); got != time.Second {
		t.Fatalf("RetrySpan of one attempt = %s, want 1s", got)
	}
}
