package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

const benchTopic = "bench.event"

// schema is one shape's outbox tables.
type schema struct {
	name  string
	table string
	store *store.Store
	b     *bench
	// lane is the bench topic's lane in the outbox processes' config: "" (the message
	// lane) or "batch".
	lane string
	// extraTopics is more of the topics map of the outbox processes' config, as YAML
	// indented under topics:.
	extraTopics string
}

func (b *bench) newSchema(ctx context.Context, shape string) (*schema, error) {
	name := fmt.Sprintf("outbox_bench_%s_%08x", shape, rand.Uint32())
	st, err := store.New(b.pool, store.Config{Schema: name})
	if err != nil {
		return nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		return nil, err
	}
	return &schema{name: name, table: pgx.Identifier{name, "outbox_messages"}.Sanitize(), store: st, b: b}, nil
}

func (s *schema) drop() {
	_, _ = s.b.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s.name}.Sanitize()+` CASCADE`)
}

// commit inserts n rows in one transaction and returns the database time of the commit.
func (s *schema) commit(ctx context.Context, n int) (time.Time, error) {
	var at time.Time
	err := pgx.BeginFunc(ctx, s.b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.table+` (topic, payload)
			SELECT $1, jsonb_build_object('n', i) FROM generate_series(1, $2) AS i`, benchTopic, n); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at)
	})
	return at, err
}

// waitSent waits until n rows matching where are sent.
func (s *schema) waitSent(ctx context.Context, where string, n int, args ...any) error {
	deadline := time.Now().Add(10*time.Minute + time.Duration(n)*100*time.Millisecond)
	for {
		var sent, dead int
		if err := s.b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status = 'dead') FROM `+s.table+` WHERE `+where, args...).Scan(&sent, &dead); err != nil {
			return err
		}
		if dead > 0 {
			return fmt.Errorf("%d messages were dead-lettered", dead)
		}
		if sent >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d messages sent", sent, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// drainRate returns n messages over the time from the commit to the last sent_at.
func (s *schema) drainRate(ctx context.Context, committed time.Time, n int) (float64, error) {
	var last time.Time
	if err := s.b.pool.QueryRow(ctx, `SELECT max(sent_at) FROM `+s.table).Scan(&last); err != nil {
		return 0, err
	}
	return float64(n) / last.Sub(committed).Seconds(), nil
}

// --- naive: three regular activities, default worker options, a plain start loop.

// naiveActivities are the activities of the naive shape: each a round trip of its own.
type naiveActivities struct {
	s   *schema
	url string
	hc  *http.Client
}

func (a *naiveActivities) Load(ctx context.Context, id string) ([]byte, error) {
	var payload []byte
	err := a.s.b.pool.QueryRow(ctx, `SELECT payload FROM `+a.s.table+` WHERE message_id = $1`, id).Scan(&payload)
	return payload, err
}

func (a *naiveActivities) Send(ctx context.Context, id string, payload []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(payload))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", id)
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

func (a *naiveActivities) MarkSent(ctx context.Context, id string) error {
	_, err := a.s.b.pool.Exec(ctx, `UPDATE `+a.s.table+` SET status = 'sent', sent_at = now() WHERE message_id = $1`, id)
	return err
}

// naiveWorkflow loads, sends and marks the message, each a regular activity with the
// SDK's default retry policy.
func naiveWorkflow(ctx workflow.Context, id string) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 30 * time.Second})
	var payload []byte
	if err := workflow.ExecuteActivity(ctx, "NaiveLoad", id).Get(ctx, &payload); err != nil {
		return err
	}
	if err := workflow.ExecuteActivity(ctx, "NaiveSend", id, payload).Get(ctx, nil); err != nil {
		return err
	}
	return workflow.ExecuteActivity(ctx, "NaiveMarkSent", id).Get(ctx, nil)
}

func (b *bench) naive(ctx context.Context, n int) (float64, error) {
	s, err := b.newSchema(ctx, "naive")
	if err != nil {
		return 0, err
	}
	defer s.drop()
	queue := "bench-naive-" + s.name
	w := sdkworker.New(b.client, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(naiveWorkflow, workflow.RegisterOptions{Name: "NaiveDelivery"})
	a := &naiveActivities{s: s, url: b.recv.srv.URL, hc: &http.Client{Timeout: 10 * time.Second}}
	w.RegisterActivityWithOptions(a.Load, activity.RegisterOptions{Name: "NaiveLoad"})
	w.RegisterActivityWithOptions(a.Send, activity.RegisterOptions{Name: "NaiveSend"})
	w.RegisterActivityWithOptions(a.MarkSent, activity.RegisterOptions{Name: "NaiveMarkSent"})
	if err := w.Start(); err != nil {
		return 0, err
	}
	defer w.Stop()

	committed, err := s.commit(ctx, n)
	if err != nil {
		return 0, err
	}
	// The relay of the naive shape: read the pending rows, start one workflow each.
	rows, err := b.pool.Query(ctx, `SELECT message_id FROM `+s.table+` WHERE status = 'pending' ORDER BY id`)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return 0, err
	}
	if err := startAll(ctx, len(ids), func(ctx context.Context, i int) error {
		id := ids[i].String()
		_, err := b.client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "naive-" + id, TaskQueue: queue}, "NaiveDelivery", id)
		return err
	}); err != nil {
		return 0, err
	}
	if err := s.waitSent(ctx, "true", n); err != nil {
		return 0, err
	}
	sampled := make([]string, 0, costSamples)
	for _, id := range ids[:min(len(ids), costSamples)] {
		sampled = append(sampled, "naive-"+id.String())
	}
	b.sample("naive", sampled)
	return s.drainRate(ctx, committed, n)
}

// startAll runs start for 0..n-1, 16 at a time: a plain client loop with some concurrency.
func startAll(ctx context.Context, n int, start func(context.Context, int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || first.Load() != nil {
					return
				}
				if err := start(ctx, i); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return *err
	}
	return nil
}

// --- bare: OutboxDelivery with no-op activities.

func (b *bench) bare(ctx context.Context, n int) (float64, error) {
	queue := fmt.Sprintf("bench-bare-%08x", rand.Uint32())
	var done atomic.Int64
	finished := make(chan struct{})
	w := sdkworker.New(b.client, queue, workerOptions())
	w.RegisterWorkflowWithOptions(workflows.Delivery, workflows.RegisterOptions())
	// The send says it recorded the row, as the outbox's does: no mark-sent step.
	w.RegisterActivityWithOptions(func(context.Context, workflows.SendInput) (workflows.SendResult, error) {
		if done.Add(1) == int64(n) {
			close(finished)
		}
		return workflows.SendResult{Recorded: true}, nil
	}, activity.RegisterOptions{Name: workflows.ActivitySend})
	w.RegisterActivityWithOptions(func(context.Context, workflows.CheckProcessedInput) (workflows.CheckProcessedResult, error) {
		return workflows.CheckProcessedResult{}, nil
	}, activity.RegisterOptions{Name: workflows.ActivityCheckProcessed})
	w.RegisterActivityWithOptions(func(context.Context, workflows.MarkSentInput) error { return nil }, activity.RegisterOptions{Name: workflows.ActivityMarkSent})
	w.RegisterActivityWithOptions(func(context.Context, workflows.DeadLetterInput) error { return nil }, activity.RegisterOptions{Name: workflows.ActivityDeadLetter})
	if err := w.Start(); err != nil {
		return 0, err
	}
	defer w.Stop()

	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	began := time.Now()
	if err := startAll(ctx, n, func(ctx context.Context, i int) error {
		in := workflows.DeliveryInput{MessageID: ids[i], Topic: benchTopic, Policy: workflows.Policy{}.WithDefaults(), SearchAttributes: true, Version: workflows.DeliveryVersion}
		// As the relay starts it (starter.Relay.StartOptions): the first attempt local.
		opts := client.StartWorkflowOptions{ID: "bare-" + in.MessageID, TaskQueue: queue, TypedSearchAttributes: workflows.StartSearchAttributes(in),
			WorkflowTaskTimeout: workflows.FirstTaskTimeout(in.Policy.SendTimeout)}
		_, err := b.client.ExecuteWorkflow(ctx, opts, workflows.WorkflowType, in)
		return err
	}); err != nil {
		return 0, err
	}
	select {
	case <-finished:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(10*time.Minute + time.Duration(n)*100*time.Millisecond):
		return 0, fmt.Errorf("only %d of %d deliveries finished", done.Load(), n)
	}
	rate := float64(n) / time.Since(began).Seconds()
	sampled := make([]string, 0, costSamples)
	for _, id := range ids[:min(n, costSamples)] {
		sampled = append(sampled, "bare-"+id)
	}
	b.sample("bare", sampled)
	return rate, nil
}

// workerOptions are the SDK worker options of the bare shape: those outbox worker uses.
func workerOptions() sdkworker.Options {
	return sdkworker.Options{MaxConcurrentActivityExecutionSize: 200, MaxConcurrentLocalActivityExecutionSize: 200}
}

// --- outbox and dev: the outbox's own processes.

func (b *bench) processes(ctx context.Context, n int) (float64, error) {
	return b.drainWith(ctx, n, "outbox", "", "worker", "relay")
}

func (b *bench) combined(ctx context.Context, n int) (float64, error) {
	return b.drainWith(ctx, n, "run", "", "run")
}

func (b *bench) dev(ctx context.Context, n int) (float64, error) {
	return b.drainWith(ctx, n, "dev", "", "dev")
}

// drainWith starts the outbox processes (worker and relay, or dev) with the bench topic in
// lane, waits until they are ready, commits n rows at once and measures the drain.
func (b *bench) drainWith(ctx context.Context, n int, shape, lane string, which ...string) (float64, error) {
	s, err := b.newSchema(ctx, shape)
	if err != nil {
		return 0, err
	}
	defer s.drop()
	s.lane = lane
	procs, err := b.startOutbox(ctx, s, which...)
	if err != nil {
		return 0, err
	}
	defer procs.stop()
	committed, err := s.commit(ctx, n)
	if err != nil {
		return 0, err
	}
	if err := s.waitSent(ctx, "true", n); err != nil {
		return 0, fmt.Errorf("%w; logs in %s", err, b.work)
	}
	rate, err := s.drainRate(ctx, committed, n)
	if err != nil {
		return 0, err
	}
	if s.lane == laneBatch {
		return rate, b.sampleBatches(ctx, s, shape)
	}
	rows, err := b.pool.Query(ctx, `SELECT message_id::text FROM `+s.table+` ORDER BY id LIMIT $1`, costSamples)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	for i, id := range ids {
		ids[i] = workflows.WorkflowID(id)
	}
	b.sample(shape, ids)
	return rate, nil
}

// sampleBatches samples up to costSamples of the batch runs that delivered s's rows, with
// the number of messages they carried, for the cost per message.
func (b *bench) sampleBatches(ctx context.Context, s *schema, shape string) error {
	rows, err := b.pool.Query(ctx, `SELECT batch_id, count(*) FROM `+s.table+`
		WHERE batch_id IS NOT NULL GROUP BY batch_id ORDER BY min(id) LIMIT $1`, costSamples)
	if err != nil {
		return err
	}
	type batch struct {
		id string
		n  int
	}
	batches, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (batch, error) {
		var x batch
		return x, r.Scan(&x.id, &x.n)
	})
	if err != nil {
		return err
	}
	if len(batches) == 0 {
		return fmt.Errorf("no row of %s names a batch: was it delivered by the message lane?", s.name)
	}
	ids := make([]string, len(batches))
	messages := 0
	for i, x := range batches {
		ids[i], messages = x.id, messages+x.n
	}
	b.sampleRuns(shape, ids, messages)
	return nil
}

// proc is an outbox process the bench started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

type procs []*proc

// peakRSS returns the process's peak resident set size (VmHWM), in bytes.
func (p *proc) peakRSS() int64 {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(p.cmd.Process.Pid), "status"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func (ps procs) stop() {
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// startOutbox starts `outbox <which>` for each of which on schema s, with a config of
// the bench's topic, and waits until each answers /readyz.
func (b *bench) startOutbox(ctx context.Context, s *schema, which ...string) (procs, error) {
	var ps procs
	for _, name := range which {
		ports, err := freePorts(1)
		if err != nil {
			return ps, err
		}
		metrics := "127.0.0.1:" + strconv.Itoa(ports[0])
		config := filepath.Join(b.work, s.name+"-"+name+".yaml")
		body := fmt.Sprintf(`schema: %s
temporal:
  task_queue: bench-%s
metrics:
  address: %s
topics:
  %s:
    url: %s/events
`, s.name, s.name, metrics, benchTopic, b.recv.srv.URL)
		if s.lane == laneBatch {
			body += "    lane: batch\n"
		}
		body += s.extraTopics
		if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
			return ps, err
		}
		args := []string{name, "--config", config}
		if name == "dev" {
			args = append(args, "--no-demo", "--dir", filepath.Join(b.work, s.name+"-dev"))
		}
		cmd := exec.Command(b.exe, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+b.dbURL, "TEMPORAL_ADDRESS="+b.temporal, "TEMPORAL_NAMESPACE=default")
		logf, err := os.Create(filepath.Join(b.work, s.name+"-"+name+".log"))
		if err != nil {
			return ps, err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return ps, fmt.Errorf("start outbox %s: %w", name, err)
		}
		p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
		ps = append(ps, p)
		if err := waitReady(ctx, p, "http://"+metrics+"/readyz"); err != nil {
			ps.stop()
			return nil, fmt.Errorf("outbox %s: %w (log %s)", name, err, logf.Name())
		}
	}
	return ps, nil
}

func waitReady(ctx context.Context, p *proc, url string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return errors.New("exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("not ready after 60s")
		}
	}
}

// quietLogger keeps the SDK's logs out of the table.
func quietLogger() log.Logger { return log.NewStructuredLogger(slog.New(slog.DiscardHandler)) }
