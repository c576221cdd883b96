// Package bench is `outbox bench`: the end-to-end benchmark. In one run, against one
// Temporal server (the built-in one in a child process by default, or TEMPORAL_ADDRESS) and
// one PostgreSQL,
// it measures
//
//   - naive: the shape a team would write first, a workflow of three regular activities
//     (load the row, send it, mark it sent) on a worker with default options, started by a
//     plain client loop: the baseline;
//   - bare: OutboxDelivery itself with no-op activities, started by a plain client loop:
//     what Temporal costs for our workflow shape, without the relay and the database;
//   - outbox: `outbox worker` and `outbox relay` as separate processes, draining rows
//     committed at once;
//   - run: `outbox run`, worker and relay in one process with eager start;
//   - dev: the single-process shape (`outbox dev` with the same database and server);
//
// then what each shape's delivered message costs on Temporal (actions and history
// events, read back from the runs' histories), commit-to-sent latency of `outbox run` and
// of the separate processes at a steady offered rate and at half their drain rate, and
// the processes' peak memory. It prints tables; the ratios are the result, the absolute
// figures depend on the machine.
//
// The Temporal server runs in a child process (dev.StartServer), so this package does not
// link it.
package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"go.temporal.io/sdk/client"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/cmd/outbox/internal/dev"
	"github.com/outbox-go/outbox/internal/temporalcost"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/store"
)

// Options are the flags of outbox bench.
type Options struct {
	// Messages is the number of rows each drain commits at once.
	Messages int
	// Rate is the offered rate of the steady latency run, in messages per second.
	Rate float64
	// LatencyMessages is the number of single-row commits of each latency run.
	LatencyMessages int
	// Runs repeats the drains, alternating the shapes, and reports min/median/max.
	Runs int
	// Only runs a subset of "naive,bare,outbox,run,dev,latency".
	Only string
	// CPUProfile, when set, writes a CPU profile of this process (the naive and bare
	// workers) to the file.
	CPUProfile string
	// Isolation, when set, measures instead whether one topic slows another: see
	// bench.isolation.
	Isolation bool
	// Bulk is the number of rows the isolation measurement commits at once for its bulk
	// topic.
	Bulk int
	// Lane, when "batch", measures the batch lane (a topic with lane: batch) beside the
	// message lane of the same topic, both with outbox run, instead of the shapes above.
	Lane string
}

// laneBatch is the value of Options.Lane (and schema.lane) for the batch lane.
const laneBatch = "batch"

// Command returns the bench subcommand.
func Command(env *cli.Env) *cobra.Command {
	o := Options{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure delivery throughput, latency and memory against the naive shape, end to end",
		Long: `Runs, against one Temporal server (the built-in one, in a child process, unless
TEMPORAL_ADDRESS is set) and
one PostgreSQL (DATABASE_URL, else TEST_DATABASE_URL, else the local server), each in a
schema of its own:

  naive    a workflow of three regular activities (load, send, mark sent), default worker
           options, started by a plain client loop: the baseline
  bare     OutboxDelivery with no-op activities, started by a plain client loop
  outbox   outbox worker and outbox relay as separate processes
  run      outbox run: worker and relay in one process, eager start
  dev      worker and relay in one process (outbox dev)
  latency  commit-to-sent of outbox run and of outbox worker + relay, at --rate and at
           half their drain rate

or, with --lane batch, the bench topic with lane: batch beside the same topic in the
message lane, both with outbox run (drains, then latency at --rate and at half their drain
rate); or, with --isolation, the bench topic's commit-to-sent at --rate with outbox run
alone, beside a topic whose downstream hangs, and beside --bulk rows of another topic;
and prints tables of messages per second, ratios, actions and history events per message
(read back from the runs' histories), latency and peak memory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Run(cmd.Context(), env, o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Messages, "messages", 1000, "rows committed at once in each drain")
	f.Float64Var(&o.Rate, "rate", 10, "offered rate of the steady latency run, messages per second")
	f.IntVar(&o.LatencyMessages, "latency-messages", 300, "single-row commits in each latency run")
	f.IntVar(&o.Runs, "runs", 1, "repeat each drain this often (alternating the shapes) and report min/median/max")
	f.StringVar(&o.Only, "only", "", `run only these parts, e.g. "naive,outbox", or with --lane batch "message,batch,latency" (default: all)`)
	f.StringVar(&o.CPUProfile, "cpu-profile", "", "write a CPU profile of this process to this file")
	f.BoolVar(&o.Isolation, "isolation", false, "measure instead whether one topic slows another: the bench topic's commit-to-sent at --rate with outbox run, alone, beside a topic whose downstream hangs, and beside --bulk rows of another topic")
	f.IntVar(&o.Bulk, "bulk", 5000, "rows of the bulk topic that --isolation commits at once")
	f.StringVar(&o.Lane, "lane", "", `"batch": measure a topic of lane batch beside the message lane of the same topic, both with outbox run`)
	return cmd
}

// bench is one run's shared state.
type bench struct {
	o        Options
	out      io.Writer
	exe      string // this program, to start outbox worker, relay and dev
	dbURL    string
	pool     *pgxpool.Pool
	temporal string // frontend address
	client   client.Client
	recv     *receiver
	work     string // a folder for configs and logs

	samplesMu sync.Mutex
	samples   map[string][]string // workflow IDs of delivered messages, by shape, for their cost
	messages  map[string]int      // the messages those runs carried, where a run carries many
}

// costSamples is how many runs of each shape the bench reads back to count their cost.
const costSamples = 20

// sample records the workflow IDs of up to costSamples delivered messages of shape.
func (b *bench) sample(shape string, ids []string) {
	b.samplesMu.Lock()
	defer b.samplesMu.Unlock()
	if b.samples == nil {
		b.samples = map[string][]string{}
	}
	b.samples[shape] = ids[:min(len(ids), costSamples)]
}

// sampleRuns records the workflow IDs of runs of shape that carried messages messages in
// all (batch runs), for their cost per message.
func (b *bench) sampleRuns(shape string, ids []string, messages int) {
	b.sample(shape, ids)
	b.samplesMu.Lock()
	defer b.samplesMu.Unlock()
	if b.messages == nil {
		b.messages = map[string]int{}
	}
	b.messages[shape] = messages
}

// cost reads back the histories sampled for shape and returns the mean actions and
// history events per message, and how many runs it read.
func (b *bench) cost(ctx context.Context, shape string) (actions, events float64, runs int, err error) {
	b.samplesMu.Lock()
	ids, messages := b.samples[shape], b.messages[shape]
	b.samplesMu.Unlock()
	if len(ids) == 0 {
		return 0, 0, 0, nil
	}
	var total temporalcost.Cost
	for _, id := range ids {
		c, err := temporalcost.OfRun(ctx, b.client, id, "")
		if err != nil {
			return 0, 0, 0, fmt.Errorf("history of %s: %w", id, err)
		}
		total = total.Add(c)
	}
	n := float64(len(ids))
	if messages > 0 {
		n = float64(messages)
	}
	return float64(total.Actions) / n, float64(total.Events) / n, len(ids), nil
}

// sampledRuns says how many runs each shape's cost was read from: "naive 20, bare 20".
func sampledRuns(names []string, runs map[string]int) string {
	parts := make([]string, 0, len(names))
	for _, n := range names {
		if r, ok := runs[n]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", n, r))
		}
	}
	return strings.Join(parts, ", ")
}

// Run runs the benchmark and prints its table to out.
func Run(ctx context.Context, env *cli.Env, o Options, out io.Writer) error {
	if o.Messages < 1 || o.LatencyMessages < 1 || o.Runs < 1 {
		return cli.UsageErrorf("--messages, --latency-messages and --runs must be at least 1, got %d, %d and %d", o.Messages, o.LatencyMessages, o.Runs)
	}
	if math.IsNaN(o.Rate) || o.Rate <= 0 || time.Duration(float64(time.Second)/o.Rate) <= 0 {
		return cli.UsageErrorf("--rate must be a positive number of messages per second, at most one a nanosecond, got %g", o.Rate)
	}
	if o.Isolation && (o.Lane != "" || o.Bulk < 1) {
		return cli.UsageErrorf("--isolation takes no --lane, and --bulk must be at least 1, got %d", o.Bulk)
	}
	if o.Lane != "" && o.Lane != "message" && o.Lane != laneBatch {
		return cli.UsageErrorf("--lane must be message or batch, got %q", o.Lane)
	}
	if err := checkOnly(o); err != nil {
		return err
	}
	b := &bench{o: o, out: out}
	var err error
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if b.exe, err = os.Executable(); err != nil {
		return err
	}
	if b.work, err = os.MkdirTemp("", "outbox-bench-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.work)

	b.dbURL = cmp.Or(lookup(env, "DATABASE_URL"), lookup(env, "TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	if b.pool, err = pgxpool.New(ctx, b.dbURL); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer b.pool.Close()
	if err := b.pool.Ping(ctx); err != nil {
		return fmt.Errorf("database %s: %w", dev.RedactURL(b.dbURL), err)
	}

	if b.temporal = lookup(env, "TEMPORAL_ADDRESS"); b.temporal == "" {
		ts, err := startTemporal(ctx)
		if err != nil {
			return err
		}
		defer ts.Stop()
		b.temporal = ts.Address
	}
	if b.client, err = client.Dial(client.Options{HostPort: b.temporal, Namespace: "default", Logger: quietLogger()}); err != nil {
		return fmt.Errorf("temporal %s: %w", b.temporal, err)
	}
	defer b.client.Close()
	if err := temporalx.EnsureSearchAttributes(ctx, b.client, "default"); err != nil {
		return err
	}
	b.recv = newReceiver()
	defer b.recv.close()

	fmt.Fprintf(out, "outbox bench: %d messages per drain, %d run(s), Temporal %s, PostgreSQL %s\n", o.Messages, o.Runs, b.temporal, dev.RedactURL(b.dbURL))
	return b.run(ctx)
}

// parts are the names --only takes in each mode: the shapes, and latency.
var (
	shapeParts = []string{"naive", "bare", "outbox", "run", "dev", "latency"}
	laneParts  = []string{"message", laneBatch, "latency"}
)

// checkOnly refuses an --only part the mode has not: a bench that measured nothing would
// print empty tables and succeed.
func checkOnly(o Options) error {
	if o.Only == "" {
		return nil
	}
	if o.Isolation {
		return cli.UsageErrorf("--isolation measures one thing and takes no --only, got %q", o.Only)
	}
	parts := shapeParts
	if o.Lane == laneBatch {
		parts = laneParts
	}
	for _, p := range strings.Split(o.Only, ",") {
		if !slices.Contains(parts, strings.TrimSpace(p)) {
			return cli.UsageErrorf("--only: %q is not a part of this bench; use a comma-separated list of %s", strings.TrimSpace(p), strings.Join(parts, ", "))
		}
	}
	return nil
}

func (b *bench) wants(part string) bool {
	if b.o.Only == "" {
		return true
	}
	for _, p := range strings.Split(b.o.Only, ",") {
		if strings.TrimSpace(p) == part {
			return true
		}
	}
	return false
}

// drainFunc drains n rows once and returns messages per second.
type drainFunc func(ctx context.Context, n int) (float64, error)

// shape is one thing the bench drains.
type shape struct {
	name, what string
	drain      drainFunc
}

func (b *bench) run(ctx context.Context) error {
	shapes := []shape{
		{"naive", "3 regular activities, default worker options, plain start loop", b.naive},
		{"bare", "OutboxDelivery with no-op activities, plain start loop", b.bare},
		{"outbox", "outbox worker + outbox relay, separate processes", b.processes},
		{"run", "outbox run: worker and relay in one process, eager start", b.combined},
		{"dev", "worker and relay in one process (outbox dev)", b.dev},
	}
	if b.o.Lane == laneBatch {
		return b.runLanes(ctx)
	}
	if b.o.Isolation {
		return b.isolation(ctx)
	}
	rates, err := b.drains(ctx, shapes)
	if err != nil {
		return err
	}

	fmt.Fprintf(b.out, "\n| shape | what | msg/s min / median / max | median vs naive | median vs bare | actions/msg | events/msg |\n|---|---|---:|---:|---:|---:|---:|\n")
	read, names := map[string]int{}, []string{}
	for _, s := range shapes {
		rs := rates[s.name]
		if len(rs) == 0 {
			continue
		}
		actions, events, runs, err := b.cost(ctx, s.name)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		read[s.name], names = runs, append(names, s.name)
		fmt.Fprintf(b.out, "| %s | %s | %s | %s | %s | %.1f | %.1f |\n", s.name, s.what, minMedMax(rs),
			ratio(median(rs), median(rates["naive"])), ratio(median(rs), median(rates["bare"])), actions, events)
	}
	fmt.Fprintf(b.out, "\nactions/msg and events/msg: the mean over delivered messages' histories (%s), by Temporal Cloud's rules (docs/benchmarks.md); msg/s ≤ the namespace's actions/s limit (500 by default) ÷ actions/msg.\n", sampledRuns(names, read))

	if b.wants("latency") {
		if err := b.latency(ctx, rates); err != nil {
			return fmt.Errorf("latency: %w", err)
		}
	}
	return nil
}

// drains drains each of shapes --runs times, alternating their order between runs so that
// none always runs on a warmer server, and returns each shape's rates.
func (b *bench) drains(ctx context.Context, shapes []shape) (map[string][]float64, error) {
	rates := map[string][]float64{}
	for run := 0; run < b.o.Runs; run++ {
		for i := range shapes {
			s := shapes[i]
			if run%2 == 1 {
				s = shapes[len(shapes)-1-i]
			}
			if !b.wants(s.name) {
				continue
			}
			r, err := s.drain(ctx, b.o.Messages)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			fmt.Fprintf(b.out, "  run %d: %-7s %8.1f msg/s\n", run+1, s.name, r)
			rates[s.name] = append(rates[s.name], r)
		}
	}
	return rates, nil
}

// latencyShapes are the outbox shapes whose commit-to-sent latency the bench measures:
// the one production process, and the worker and relay apart.
var latencyShapes = []struct {
	name, what string
	procs      []string
}{
	{"run", "outbox run (one process, eager start)", []string{"run"}},
	{"outbox", "outbox worker + outbox relay", []string{"worker", "relay"}},
}

// latency runs single-row commits at the offered rate and at half the shape's drain rate
// against each of latencyShapes, and reports commit-to-sent percentiles, their phases
// and the processes' peak memory.
func (b *bench) latency(ctx context.Context, drains map[string][]float64) error {
	type row struct {
		shape, what  string
		rate         float64
		p50, p99, mx time.Duration
		ps           []phases
	}
	var rows []row
	var rss []string
	for _, ls := range latencyShapes {
		err := func() error {
			sc, err := b.newSchema(ctx, "latency_"+ls.name)
			if err != nil {
				return err
			}
			defer sc.drop()
			procs, err := b.startOutbox(ctx, sc, ls.procs...)
			if err != nil {
				return err
			}
			defer procs.stop()
			rates := []float64{b.o.Rate}
			if capacity := median(drains[ls.name]); capacity > 0 {
				rates = append(rates, capacity/2)
			}
			for _, rate := range rates {
				p50, p99, mx, ps, err := b.steady(ctx, sc, rate, b.o.LatencyMessages)
				if err != nil {
					return err
				}
				rows = append(rows, row{ls.name, ls.what, rate, p50, p99, mx, ps})
			}
			for _, p := range procs {
				rss = append(rss, fmt.Sprintf("| outbox %s (%s) | %s |", p.name, ls.name, mib(p.peakRSS())))
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("%s: %w", ls.name, err)
		}
	}
	fmt.Fprintf(b.out, "\n| shape | offered rate | messages | commit-to-sent p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(b.out, "| %s | %.1f msg/s | %d | %s | %s | %s |\n", r.what, r.rate, b.o.LatencyMessages, ms(r.p50), ms(r.p99), ms(r.mx))
	}
	fmt.Fprintln(b.out, "\nMedian phases of a sample of those messages:")
	printPhasesHeader(b.out)
	for _, r := range rows {
		printPhases(b.out, fmt.Sprintf("%s, %.1f msg/s", r.shape, r.rate), r.ps)
	}
	fmt.Fprintf(b.out, "\n| process | peak RSS |\n|---|---:|\n%s\n", strings.Join(rss, "\n"))
	return nil
}

// steady commits n single-row transactions at rate and returns the percentiles of
// sent_at - created_at once all are sent, and the phases of a sample of the messages.
func (b *bench) steady(ctx context.Context, sc *schema, rate float64, n int) (p50, p99, mx time.Duration, ps []phases, err error) {
	tag := strconv.FormatInt(rand.Int64(), 36)
	every := time.Duration(float64(time.Second) / rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := 0; i < n; i++ {
		if _, err := sc.store.Enqueue(ctx, b.pool, store.Message{Topic: benchTopic, Payload: []byte(`{"run": "` + tag + `"}`)}); err != nil {
			return 0, 0, 0, nil, err
		}
		select {
		case <-ctx.Done():
			return 0, 0, 0, nil, ctx.Err()
		case <-tick.C:
		}
	}
	if err := sc.waitSent(ctx, `payload->>'run' = $1`, n, tag); err != nil {
		return 0, 0, 0, nil, err
	}
	var a, c, d float64
	err = b.pool.QueryRow(ctx, `SELECT
  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)),
  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)),
  max(extract(epoch FROM sent_at - created_at))
FROM `+sc.table+` WHERE payload->>'run' = $1`, tag).Scan(&a, &c, &d)
	if err != nil {
		return 0, 0, 0, nil, err
	}
	if sc.lane == laneBatch {
		// A batch's messages have no runs of their own to read phases from.
		return secs(a), secs(c), secs(d), nil, nil
	}
	ps, err = sc.samplePhases(ctx, b.client, tag, 50)
	return secs(a), secs(c), secs(d), ps, err
}

// samplePhases reads the phases of up to n messages of the run tagged tag, evenly spread.
func (s *schema) samplePhases(ctx context.Context, c client.Client, tag string, n int) ([]phases, error) {
	rows, err := s.b.pool.Query(ctx, `SELECT message_id::text, created_at, sent_at FROM `+s.table+`
		WHERE payload->>'run' = $1 ORDER BY id`, tag)
	if err != nil {
		return nil, err
	}
	type msg struct {
		id            string
		created, sent time.Time
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (msg, error) {
		var m msg
		return m, r.Scan(&m.id, &m.created, &m.sent)
	})
	if err != nil {
		return nil, err
	}
	step := max(len(all)/n, 1)
	var ps []phases
	for i := 0; i < len(all); i += step {
		p, err := messagePhases(ctx, c, all[i].id, all[i].created, all[i].sent)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// receiver is the downstream of every shape: it answers 200 at once and counts (but the
// hanging topic's, see hang).
type receiver struct {
	srv     *httptest.Server
	count   atomic.Int64
	closing chan struct{}
}

func newReceiver() *receiver {
	r := &receiver{closing: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if isHang(req) {
			hang(w, req, r.closing)
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		r.count.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	return r
}

// close stops the receiver; requests still open (the hanging topic's) are answered.
func (r *receiver) close() {
	close(r.closing)
	r.srv.Close()
}

// startTemporal starts the built-in Temporal server (as outbox dev --temporal-server
// builtin --ephemeral runs it: the same server whatever is installed, so figures compare
// from machine to machine) on free ports, its state thrown away at the end, without the UI.
func startTemporal(ctx context.Context) (*dev.Server, error) {
	for try := 1; ; try++ {
		ports, err := freePorts(4)
		if err != nil {
			return nil, err
		}
		srv, err := dev.StartServer(ctx, dev.ServerBuiltin, dev.TemporalOptions{
			FrontendPort: ports[0], HistoryPort: ports[1], MatchingPort: ports[2], WorkerPort: ports[3],
			LogFile: filepath.Join(os.TempDir(), "outbox-bench-temporal.log"),
		}, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		// A port found free can be taken before the server listens on it (by any
		// connection's local port): pick others.
		if err != nil && try < 3 && strings.Contains(err.Error(), "address already in use") {
			continue
		}
		return srv, err
	}
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func lookup(env *cli.Env, name string) string {
	v, _ := env.LookupEnv(name)
	return v
}

// median is the middle value of xs, or the mean of the two middle values when there is
// an even number of them.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func minMedMax(xs []float64) string {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return fmt.Sprintf("%.1f / %.1f / %.1f", s[0], median(s), s[len(s)-1])
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func mib(b int64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}
