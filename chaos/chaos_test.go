//go:build linux

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store"
)

// loader commits n business transactions (a chaos_orders row and its outbox message),
// concurrently, retrying a transaction that fails (the database restarting). A transaction
// counts as committed only when its commit returned no error; one that failed is
// "uncertain" (its commit may have reached the database before the connection broke) and
// the checker settles it from the table.
type loader struct {
	mu        sync.Mutex
	committed map[uuid.UUID]bool
	uncertain map[uuid.UUID]bool
	done      atomic.Int64 // committed so far
	retries   atomic.Int64 // failed business transactions (retried with a new message)
	errs      []string     // a few of the errors, for the log
}

func newLoader() *loader {
	return &loader{committed: map[uuid.UUID]bool{}, uncertain: map[uuid.UUID]bool{}}
}

// run commits n messages with conc goroutines over about spread, and returns when all are
// committed or ctx ends.
func (l *loader) run(ctx context.Context, e *chaosEnv, n, conc int, spread time.Duration) error {
	var next atomic.Int64
	perTx := spread * time.Duration(conc) / time.Duration(n)
	var wg sync.WaitGroup
	errc := make(chan error, conc)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seq := next.Add(1)
				if seq > int64(n) {
					return
				}
				if err := l.commitOne(ctx, e, int(seq)); err != nil {
					errc <- err
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(perTx):
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

func (l *loader) commitOne(ctx context.Context, e *chaosEnv, seq int) error {
	payload, _ := json.Marshal(map[string]any{"seq": seq, "note": "chaos"})
	for {
		if ctx.Err() != nil {
			return fmt.Errorf("business transaction %d not committed: %w", seq, ctx.Err())
		}
		id := uuid.Must(uuid.NewV7())
		l.mu.Lock()
		l.uncertain[id] = true // until the commit returns
		l.mu.Unlock()
		txCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := pgx.BeginFunc(txCtx, e.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(txCtx, `INSERT INTO chaos_orders (seq, message_id) VALUES ($1, $2)`, seq, id); err != nil {
				return err
			}
			_, err := e.store.Enqueue(txCtx, tx, store.Message{Topic: topic, Payload: payload, MessageID: id})
			return err
		})
		cancel()
		if err == nil {
			l.mu.Lock()
			delete(l.uncertain, id)
			l.committed[id] = true
			l.mu.Unlock()
			l.done.Add(1)
			return nil
		}
		l.retries.Add(1)
		l.mu.Lock()
		if len(l.errs) < 5 {
			l.errs = append(l.errs, err.Error())
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitFor polls cond every 20ms until it holds or within passes.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

type row struct {
	status     store.Status
	lastError  string
	retryTimes int
}

// result is what the checker found for one fault.
type result struct {
	messages, sent, dead, lost, dups, uncertain int
	notCommitted                                []string
	duplicated                                  []string
}

// check waits until every committed message is sent or dead, then compares the table with
// what the receiver got.
func check(t *testing.T, e *chaosEnv, l *loader, within time.Duration) result {
	t.Helper()
	ctx := context.Background()
	var rows map[uuid.UUID]row
	deadline := time.Now().Add(within)
	var lastErr error
	var pending []string
	for {
		rows, lastErr = readRows(ctx, e)
		if lastErr == nil {
			pending = pending[:0]
			for id := range l.committed {
				r, ok := rows[id]
				if !ok || (r.status != store.StatusSent && r.status != store.StatusDead) {
					pending = append(pending, fmt.Sprintf("%s (%s)", id, r.status))
				}
			}
			if len(pending) == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	require.NoError(t, lastErr, "reading outbox_messages")

	// Transactions whose commit failed count as committed if their row is there.
	committed := map[uuid.UUID]bool{}
	for id := range l.committed {
		committed[id] = true
	}
	res := result{}
	for id := range l.uncertain {
		if _, ok := rows[id]; ok {
			committed[id] = true
			res.uncertain++
		}
	}
	for id := range rows {
		require.True(t, committed[id], "row %s is in outbox_messages but its transaction was never started by the loader", id)
	}
	snap := e.downstream()
	res.messages = len(committed)
	var lost []string
	for id := range committed {
		r, ok := rows[id]
		key := id.String()
		switch {
		case !ok:
			lost = append(lost, key+" (row missing)")
		case r.status == store.StatusSent:
			res.sent++
			if !snap.Effects[key] {
				lost = append(lost, key+" (sent, never reached the receiver)")
			}
		case r.status == store.StatusDead:
			res.dead++
			if strings.TrimSpace(r.lastError) == "" {
				t.Errorf("message %s is dead without a last_error", key)
			}
		default:
			lost = append(lost, fmt.Sprintf("%s (still %s after %s, retry_times %d, last_error %q)", key, r.status, within, r.retryTimes, r.lastError))
		}
	}
	res.lost = len(lost)
	sort.Strings(lost)
	for key, n := range snap.Requests {
		id, err := uuid.Parse(key)
		if err != nil || !committed[id] {
			res.notCommitted = append(res.notCommitted, key)
		}
		// A duplicate is a POST that arrives after the message was processed; a retry of
		// a request the receiver refused or dropped is not one.
		if d := snap.Redelivered[key]; d > 0 {
			res.dups += d
			res.duplicated = append(res.duplicated, fmt.Sprintf("%s x%d requests, attempts %v", key, n, snap.Attempts[key]))
		}
	}
	sort.Strings(res.duplicated)
	if len(lost) > 0 {
		t.Errorf("%d committed messages were lost or left undelivered, e.g.:\n  %s", len(lost), strings.Join(first(lost, 10), "\n  "))
	}
	if len(res.notCommitted) > 0 {
		t.Errorf("the receiver got %d messages that were never committed, e.g. %v", len(res.notCommitted), first(res.notCommitted, 10))
	}
	if len(snap.Bad) > 0 {
		t.Errorf("the receiver got %d requests without Idempotency-Key/Outbox-Attempt, e.g. %v", len(snap.Bad), first(snap.Bad, 5))
	}
	if len(res.duplicated) > 0 {
		t.Logf("duplicates (%d extra requests on %d messages), e.g.:\n  %s", res.dups, len(res.duplicated), strings.Join(first(res.duplicated, 10), "\n  "))
	}
	t.Logf("downstream: %d requests, %d check_url GETs, %d effects", snap.Total, snap.Checks, len(snap.Effects))
	return res
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func readRows(ctx context.Context, e *chaosEnv) (map[uuid.UUID]row, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rs, err := e.pool.Query(ctx, `SELECT message_id, status, coalesce(last_error, ''), retry_times FROM outbox_messages WHERE topic = $1`, topic)
	if err != nil {
		return nil, err
	}
	out := map[uuid.UUID]row{}
	for rs.Next() {
		var id uuid.UUID
		var r row
		if err := rs.Scan(&id, &r.status, &r.lastError, &r.retryTimes); err != nil {
			rs.Close()
			return nil, err
		}
		out[id] = r
	}
	return out, rs.Err()
}

// runFault loads n messages while fault runs, checks the outcome and records a summary
// row. fault gets the loader to time itself on its progress.
func runFault(t *testing.T, e *chaosEnv, name string, n int, zeroDuplicates bool, fault func(l *loader)) {
	t.Helper()
	spread := max(5*time.Second, time.Duration(n)*20*time.Millisecond) // 50 messages/s
	runFaultOver(t, e, name, n, spread, zeroDuplicates, fault)
}

// runFaultOver is runFault with the load committed over spread.
func runFaultOver(t *testing.T, e *chaosEnv, name string, n int, spread time.Duration, zeroDuplicates bool, fault func(l *loader)) {
	t.Helper()
	start := time.Now()
	l := newLoader()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	loadErr := make(chan error, 1)
	go func() { loadErr <- l.run(ctx, e, n, 8, spread) }()
	faultDone := make(chan struct{})
	go func() { defer close(faultDone); fault(l) }()
	require.NoError(t, <-loadErr)
	<-faultDone
	t.Logf("loaded %d messages in %s (%d business transactions failed and were retried: %v)",
		l.done.Load(), time.Since(start).Round(time.Millisecond), l.retries.Load(), l.errs)

	res := check(t, e, l, 5*time.Minute)
	e.checkAlive()
	wall := time.Since(start)
	sr := summaryRow{fault: name, messages: res.messages, sent: res.sent, dead: res.dead, lost: res.lost,
		dups: res.dups, uncertain: res.uncertain, retried: int(l.retries.Load()),
		receiverReqs: e.downstream().Total, wall: wall}
	summaryMu.Lock()
	summary = append(summary, sr)
	summaryMu.Unlock()
	t.Logf("SUMMARY fault=%s messages=%d sent=%d dead=%d lost=%d duplicates=%d wall=%s",
		name, sr.messages, sr.sent, sr.dead, sr.lost, sr.dups, wall.Round(100*time.Millisecond))
	// The healthy topic's downstream recovers from every fault: its messages end sent,
	// never dead-lettered.
	require.Zero(t, res.dead, "fault %s dead-lettered messages of the healthy topic", name)
	if zeroDuplicates {
		require.Zero(t, res.dups, "fault %s must not duplicate deliveries", name)
	}
}

// TestWorkerKilledMidSend SIGKILLs the worker three times while sends are in flight (the
// receiver takes 50ms per request), starting a new one each time. A send whose outcome was
// lost with the worker is ambiguous; the topic has a check_url, so the next attempt asks
// first and nothing is delivered twice.
func TestWorkerKilledMidSend(t *testing.T) {
	e := newEnv(t)
	n := messagesPerFault(t)
	e.rcv.setDelay(50 * time.Millisecond)
	runFault(t, e, "worker-kill", n, true, func(*loader) { killDuringSends(t, e, "worker", n) })
}

// killDuringSends SIGKILLs the outbox process which three times, at a quarter, half and
// three quarters of n receiver requests, starting a new one each time, and requires that
// the kills hit sends in flight: requests the receiver was still working on (its delay)
// when the process died.
func killDuringSends(t *testing.T, e *chaosEnv, which string, n int) {
	hit := 0
	for k := 1; k <= 3; k++ {
		target := k * n / 4
		if !waitFor(2*time.Minute, func() bool { return e.rcv.totalRequests() >= target }) {
			t.Errorf("the receiver never reached %d requests before kill %d", target, k)
			return
		}
		inFlight := e.rcv.sendsInFlight()
		if err := e.killOutbox(which, 200*time.Millisecond); err != nil {
			t.Errorf("restart %s: %v", which, err)
			return
		}
		hit += inFlight
		t.Logf("%s killed (%d) at %d receiver requests, with %d sends in flight", which, k, e.rcv.totalRequests(), inFlight)
	}
	if hit == 0 {
		t.Errorf("no kill of %s hit a send in flight", which)
	}
}

// TestRunKilledDuringDrain SIGKILLs `outbox run` (worker and relay in one process, eager
// start, first attempts as local activities) three times while it drains a backlog
// committed at once (the receiver takes 50ms per request), starting a new one each time. A
// first attempt lost with its process is found by the next process when its workflow
// task times out, and checked (check_url) before any resend: nothing is lost and nothing
// delivered twice. The healthy topic runs on the default delivery policy.
func TestRunKilledDuringDrain(t *testing.T) {
	e := newEnvSink(t, httpSink, "", "", oneProcess)
	n := messagesPerFault(t)
	e.rcv.setDelay(50 * time.Millisecond)
	runFaultOver(t, e, "run-kill-drain", n, time.Second, true, func(*loader) { killDuringSends(t, e, "run", n) })
}

// TestTwoRunProcesses runs two `outbox run` processes against one database, namespace and
// task queue (each relay hands the runs it starts to its own worker) while they drain a
// backlog, and SIGKILLs one of them half way, starting it again. Their relays claim
// disjoint rows, and a run whose process died is finished by either: nothing is lost and
// nothing delivered twice. The healthy topic runs on the default delivery policy.
func TestTwoRunProcesses(t *testing.T) {
	e := newEnvSink(t, httpSink, "", "", twoProcesses)
	n := messagesPerFault(t)
	e.rcv.setDelay(50 * time.Millisecond)
	runFaultOver(t, e, "two-run-processes", n, time.Second, true, func(l *loader) {
		if !waitFor(2*time.Minute, func() bool { return e.rcv.totalRequests() >= n/2 }) {
			t.Errorf("the receiver never reached %d requests", n/2)
			return
		}
		if err := e.killOutbox("run#2", 200*time.Millisecond); err != nil {
			t.Errorf("restart the second outbox run: %v", err)
			return
		}
		t.Logf("the second outbox run killed at %d receiver requests", e.rcv.totalRequests())
	})
}

// TestRelayKilledWhileStarting SIGKILLs the relay three times while it claims rows and
// starts workflows, starting a new one each time. A row claimed by the dead relay waits out
// its lease; one whose workflow was started but not recorded is taken over by "already
// started". No message may be delivered twice.
func TestRelayKilledWhileStarting(t *testing.T) {
	e := newEnv(t)
	n := messagesPerFault(t)
	runFault(t, e, "relay-kill", n, true, func(l *loader) {
		for k := 1; k <= 3; k++ {
			target := int64(k * n / 4)
			if !waitFor(2*time.Minute, func() bool { return l.done.Load() >= target }) {
				t.Errorf("the loader never reached %d commits before kill %d", target, k)
				return
			}
			if err := e.killOutbox("relay", 200*time.Millisecond); err != nil {
				t.Errorf("restart the relay: %v", err)
				return
			}
			t.Logf("relay killed (%d) at %d commits", k, l.done.Load())
		}
	})
}

// TestPostgresRestart stops PostgreSQL (fast shutdown) halfway through the load and starts
// it again on the same port and data folder. The loader retries its failed transactions;
// worker and relay must ride it out; no message may be delivered twice.
func TestPostgresRestart(t *testing.T) {
	e := newEnv(t)
	n := messagesPerFault(t)
	runFault(t, e, "postgres-restart", n, true, func(l *loader) {
		target := int64(n / 2)
		if !waitFor(2*time.Minute, func() bool { return l.done.Load() >= target }) {
			t.Errorf("the loader never reached %d commits", target)
			return
		}
		down, err := e.restartPG(time.Second)
		if err != nil {
			t.Errorf("restart PostgreSQL: %v", err)
			return
		}
		t.Logf("PostgreSQL restarted at %d commits; down for %s", l.done.Load(), down.Round(time.Millisecond))
	})
}

// TestTemporalRestart stops the Temporal server halfway through the load and starts it
// again on the same folder. Starts, sends and completions the server did not take are
// made again once it is back; a send whose completion was lost is checked (check_url)
// before it is resent, so nothing is delivered twice.
func TestTemporalRestart(t *testing.T) {
	e := newEnv(t)
	n := messagesPerFault(t)
	runFault(t, e, "temporal-restart", n, true, func(l *loader) {
		target := int64(n / 2)
		if !waitFor(2*time.Minute, func() bool { return l.done.Load() >= target }) {
			t.Errorf("the loader never reached %d commits", target)
			return
		}
		down, err := e.restartTemporal(time.Second)
		if err != nil {
			t.Errorf("restart Temporal: %v", err)
			return
		}
		t.Logf("Temporal restarted at %d commits; down for %s", l.done.Load(), down.Round(time.Millisecond))
	})
}

// TestDownstreamFlapping makes the receiver fail requests in turn (503s, resets, answers
// after the send timeout) for a window. Duplicates are counted, not refused: a request
// answered late is processed only after its delay, so a check made before then finds
// nothing and the message is sent again.
func TestDownstreamFlapping(t *testing.T) {
	e := newEnv(t)
	n := messagesPerFault(t)
	runFault(t, e, "downstream-flapping", n, false, func(l *loader) {
		e.rcv.setFlapping(true)
		target := int64(n / 2)
		if !waitFor(2*time.Minute, func() bool { return l.done.Load() >= target }) {
			t.Errorf("the loader never reached %d commits", target)
		}
		time.Sleep(3 * time.Second)
		e.rcv.setFlapping(false)
		t.Logf("the receiver flapped until %d commits and 3s more", l.done.Load())
	})
}

// commitToSent returns the median and 95th percentile of sent_at - created_at of the
// healthy topic's messages.
func commitToSent(t *testing.T, e *chaosEnv) (p50, p95 time.Duration) {
	t.Helper()
	var a, b float64
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT
  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)),
  percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at))
FROM outbox_messages WHERE topic = $1 AND status = 'sent'`, topic).Scan(&a, &b))
	return time.Duration(a * float64(time.Second)), time.Duration(b * float64(time.Second))
}

// TestPoisonAndHangingTopics runs the healthy topic beside a topic whose downstream always
// answers 422 and one whose downstream never answers, with few activity slots so hanging
// sends fill them. The healthy messages must all be sent; their latency is reported next to
// a run without the bad topics, not asserted.
func TestPoisonAndHangingTopics(t *testing.T) {
	n := messagesPerFault(t)
	base := newEnvWith(t, "worker:\n  max_concurrent_activities: 8\n")
	runFault(t, base, "no-fault-baseline", n, true, func(*loader) {})
	baseP50, baseP95 := commitToSent(t, base)

	e := newEnvWith(t, `  chaos.poison:
    url: RECEIVER/poison
    max_attempts: 3
    initial_interval: 100ms
  chaos.hang:
    url: RECEIVER/hang
    max_attempts: 3
    initial_interval: 100ms
    timeout: 2s
worker:
  max_concurrent_activities: 8
`)
	var bad []uuid.UUID
	var badMu sync.Mutex
	runFault(t, e, "poison-and-hanging", n, true, func(l *loader) {
		// One poison and one hanging message for every ten healthy ones, while they load.
		ctx := context.Background()
		for i := 0; i < n/5; i++ {
			topic := "chaos.poison"
			if i%2 == 1 {
				topic = "chaos.hang"
			}
			id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: topic, Payload: json.RawMessage(`{}`)})
			if err != nil {
				t.Errorf("enqueue %s: %v", topic, err)
				return
			}
			badMu.Lock()
			bad = append(bad, id)
			badMu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	})
	p50, p95 := commitToSent(t, e)
	t.Logf("healthy topic commit-to-sent: p50 %s, p95 %s beside poison and hanging topics; p50 %s, p95 %s without them",
		p50.Round(time.Millisecond), p95.Round(time.Millisecond), baseP50.Round(time.Millisecond), baseP95.Round(time.Millisecond))
	latencyNotes = append(latencyNotes, fmt.Sprintf("healthy-topic commit-to-sent beside poison and hanging topics: p50 %s p95 %s (no-fault run: p50 %s p95 %s)",
		p50.Round(time.Millisecond), p95.Round(time.Millisecond), baseP50.Round(time.Millisecond), baseP95.Round(time.Millisecond)))

	// The bad topics end dead, each with its reason.
	require.True(t, waitFor(3*time.Minute, func() bool {
		var open int
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_messages WHERE message_id = ANY($1) AND status <> 'dead'`, bad).Scan(&open))
		return open == 0
	}), "poison and hanging messages are dead-lettered")
	var withoutReason int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_messages WHERE message_id = ANY($1) AND coalesce(last_error, '') = ''`, bad).Scan(&withoutReason))
	require.Zero(t, withoutReason)
}

// latencyNotes are printed under the summary table.
var latencyNotes []string

// TestOwnPostgresDown30s stops the outbox's own PostgreSQL for 30 seconds halfway through
// the load, with the healthy topic on the default policy (12 attempts from 1s apart). The
// outage is not the downstream's failure: it uses up no attempt, dead-letters nothing, and
// every message ends sent, none twice. It runs against `outbox worker` and `outbox relay`,
// and against `outbox run`, whose first attempts run as local activities in the first
// workflow task; the receiver answers after 200ms, so sends are in flight when the
// database goes.
func TestOwnPostgresDown30s(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare []func(*chaosEnv)
	}{
		{"postgres-down-30s", nil},
		{"postgres-down-30s-run", []func(*chaosEnv){oneProcess}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvSink(t, httpSink, "", "", tc.prepare...)
			n := messagesPerFault(t)
			// Slow answers keep about ten sends in flight when the database goes: their
			// rows cannot be recorded sent until it is back.
			e.rcv.setDelay(200 * time.Millisecond)
			runFault(t, e, tc.name, n, true, func(l *loader) {
				target := int64(n / 2)
				if !waitFor(2*time.Minute, func() bool { return l.done.Load() >= target }) {
					t.Errorf("the loader never reached %d commits", target)
					return
				}
				down, err := e.restartPG(30 * time.Second)
				if err != nil {
					t.Errorf("restart PostgreSQL: %v", err)
					return
				}
				t.Logf("PostgreSQL down at %d commits, for %s", l.done.Load(), down.Round(time.Millisecond))
			})
			requireNoAttemptUsed(t, e)
		})
	}
}

// requireNoAttemptUsed checks that no healthy message used up an attempt: a send that
// found the outbox's database down is not an attempt. The row's retry_times stays 0, and,
// since a failure the database cannot record leaves retry_times alone, every request the
// downstream got says attempt 1 (Outbox-Attempt).
func requireNoAttemptUsed(t *testing.T, e *chaosEnv) {
	t.Helper()
	var used int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND retry_times > 0`, topic).Scan(&used))
	require.Zero(t, used, "messages that used up an attempt for the outbox's own outage")
	for id, attempts := range e.downstream().Attempts {
		for _, n := range attempts {
			require.Equal(t, 1, n, "message %s reached the downstream as attempt %d: the outage used up attempts", id, n)
		}
	}
}

// TestDownstreamBinaryBodies runs the healthy topic beside two whose downstream answers
// 422 and 500 with a binary body full of NUL bytes, which PostgreSQL cannot store as text.
// Their messages end dead with a readable reason after exactly their attempts (no run that
// cannot record its outcome and starts over), and the healthy ones end sent.
func TestDownstreamBinaryBodies(t *testing.T) {
	n := messagesPerFault(t)
	e := newEnvWith(t, `  chaos.binary422:
    url: RECEIVER/binary422
  chaos.binary500:
    url: RECEIVER/binary500
    max_attempts: 3
    initial_interval: 100ms
`)
	var bad []uuid.UUID
	runFault(t, e, "downstream-nul-bodies", n, true, func(l *loader) {
		ctx := context.Background()
		for i := 0; i < n/5; i++ {
			topic := "chaos.binary422"
			if i%2 == 1 {
				topic = "chaos.binary500"
			}
			id, err := e.store.Enqueue(ctx, e.pool, store.Message{Topic: topic, Payload: json.RawMessage(`{}`)})
			if err != nil {
				t.Errorf("enqueue %s: %v", topic, err)
				return
			}
			bad = append(bad, id)
			time.Sleep(50 * time.Millisecond)
		}
	})
	require.True(t, waitFor(3*time.Minute, func() bool {
		var open int
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_messages WHERE message_id = ANY($1) AND status <> 'dead'`, bad).Scan(&open))
		return open == 0
	}), "the binary-body messages are dead-lettered")
	var unreadable, dls int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_messages WHERE message_id = ANY($1) AND position('\x00' IN coalesce(last_error, '')) = 0`, bad).Scan(&unreadable))
	require.Zero(t, unreadable, "every reason shows the NUL bytes as \\x00")
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_dead_letters WHERE message_id = ANY($1)`, bad).Scan(&dls))
	require.Equal(t, len(bad), dls, "one dead letter each")
	binary := e.rcv.binaryRequests()
	require.Equal(t, (len(bad)+1)/2, binary["binary422"], "a 4xx is sent once")
	require.Equal(t, 3*(len(bad)/2), binary["binary500"], "a 5xx is sent its 3 attempts, by one run")
}
