package outboxtest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/outboxtest"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

// invoice is the payload of the team's invoice.issued messages.
type invoice struct {
	ID    int64  `json:"invoice_id"`
	Email string `json:"email"`
}

// issueInvoice is the code under test: it enqueues an invoice's message in the business
// transaction (which would insert the invoice row too).
func issueInvoice(ctx context.Context, pool *pgxpool.Pool, st *store.Store, inv invoice) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := st.EnqueueJSON(ctx, tx, store.Message{Topic: "invoice.issued"}, inv)
		return err
	})
}

// testIssueInvoice is the team's test; in a _test.go file it is func TestIssueInvoice(t
// *testing.T).
func testIssueInvoice(t testing.TB) {
	ctx := context.Background()
	pool, st := outboxtest.Schema(t, "") // TEST_DATABASE_URL, or a local PostgreSQL

	if err := issueInvoice(ctx, pool, st, invoice{ID: 7, Email: "ada@example.com"}); err != nil {
		t.Fatalf("issueInvoice: %v", err)
	}
	msg := outboxtest.RequireEnqueued(t, pool, st, "invoice.issued", func(inv invoice) bool { return inv.ID == 7 })
	outboxtest.RequireNotEnqueued(t, pool, st, "invoice.voided")

	// The team's activity receives the message through the outbox's delivery workflow, in
	// the Temporal SDK's test environment: its first attempt fails, the retry succeeds.
	policy := workflows.Policy{Activity: &workflows.ActivityHandler{Activity: "EmailInvoice", TaskQueue: "billing"}}
	res, err := outboxtest.Deliver(t, st, msg.MessageID, policy, func(r outboxtest.Registry) {
		r.RegisterActivityWithOptions(func(ctx context.Context, m delivery.Message) error {
			if m.Attempt == 1 {
				return temporal.NewApplicationError("mail server busy", "Busy")
			}
			return nil // sent, de-duplicated by m.MessageID
		}, activity.RegisterOptions{Name: "EmailInvoice"})
	})
	if err != nil {
		t.Fatalf("deliver: %v", err)
	}
	row, err := st.Get(ctx, msg.MessageID)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if res.Attempts != 2 || row.Status != store.StatusSent {
		t.Errorf("got %d attempts and status %s, want 2 and sent", res.Attempts, row.Status)
	}
	fmt.Printf("attempts: %d, status: %s\n", res.Attempts, row.Status) // what the example shows; a test needs no output
}

// A team tests its outbox code against a real PostgreSQL: Schema gives the test a fresh
// migrated schema, RequireEnqueued and RequireNotEnqueued check what the code enqueued,
// and Deliver runs a message through the delivery workflow to the team's activity without
// a Temporal server.
func Example() {
	t := newExampleT()
	defer t.cleanup()
	testIssueInvoice(t)
	// Output: attempts: 2, status: sent
}

// exampleT is the testing.TB the example runs the test with, where go test gives a TestXxx
// function its *testing.T. It has the methods outboxtest and the test call, and writes
// what the test logs to standard error, out of the example's output.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func newExampleT() *exampleT { return &exampleT{} }

func (t *exampleT) Helper()                           {}
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Logf(format string, args ...any)   { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (t *exampleT) Errorf(format string, args ...any) { t.Logf("FAIL: "+format, args...) }
func (t *exampleT) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }

func (t *exampleT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
