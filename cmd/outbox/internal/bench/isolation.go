package bench

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/outbox-go/outbox/store"
)

// Topics of the isolation measurement beside the bench topic: one whose downstream hangs
// until the send times out, and one with a backlog of rows committed at once.
const (
	hangTopic = "bench.hanging"
	bulkTopic = "bench.bulk"
)

// isolationTopics is the config of those topics, with the outbox's defaults (a send
// times out after 30 s).
func (b *bench) isolationTopics() string {
	return fmt.Sprintf("  %s:\n    url: %s/hang\n  %s:\n    url: %s/events\n", hangTopic, b.recv.srv.URL, bulkTopic, b.recv.srv.URL)
}

// isolation measures whether one topic slows another, with outbox run: the bench topic's
// commit-to-sent at --rate alone, while a topic whose downstream hangs receives messages at
// the same rate, and right after --bulk rows of a third topic are committed at once. Each
// runs in a schema and an outbox run process of its own.
func (b *bench) isolation(ctx context.Context) error {
	type row struct {
		beside       string
		p50, p99, mx time.Duration
	}
	var rows []row
	// measure runs beside (which starts the other topic's load and returns what stops it)
	// and the bench topic's steady run in a fresh schema and process.
	measure := func(what string, beside func(sc *schema) (stop func() error, err error)) error {
		sc, err := b.newSchema(ctx, "isolation")
		if err != nil {
			return err
		}
		defer sc.drop()
		sc.extraTopics = b.isolationTopics()
		procs, err := b.startOutbox(ctx, sc, "run")
		if err != nil {
			return err
		}
		defer procs.stop()
		stop, err := beside(sc)
		if err != nil {
			return fmt.Errorf("isolation, %s: %w", what, err)
		}
		p50, p99, mx, _, err := b.steady(ctx, sc, b.o.Rate, b.o.LatencyMessages)
		if serr := stop(); err == nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("isolation, %s: %w", what, err)
		}
		rows = append(rows, row{what, p50, p99, mx})
		return nil
	}

	if err := measure("nothing (idle)", func(*schema) (func() error, error) {
		return func() error { return nil }, nil
	}); err != nil {
		return err
	}

	// The hanging topic gets messages at the same rate from a few seconds before the
	// measurement to its end, so its sends hold whatever they hold before it starts.
	if err := measure(fmt.Sprintf("a topic whose downstream hangs to the send timeout (30 s), %.0f msg/s", b.o.Rate), func(sc *schema) (func() error, error) {
		hangCtx, stopHang := context.WithCancel(ctx)
		var hanging sync.WaitGroup
		var hangErr error
		hanging.Add(1)
		go func() {
			defer hanging.Done()
			tick := time.NewTicker(time.Duration(float64(time.Second) / b.o.Rate))
			defer tick.Stop()
			for {
				if _, err := sc.store.Enqueue(hangCtx, b.pool, store.Message{Topic: hangTopic, Payload: []byte(`{}`)}); err != nil {
					if hangCtx.Err() == nil {
						hangErr = err
					}
					return
				}
				select {
				case <-hangCtx.Done():
					return
				case <-tick.C:
				}
			}
		}()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
		return func() error {
			stopHang()
			hanging.Wait()
			return hangErr
		}, nil
	}); err != nil {
		return err
	}

	// What the bulk topic drained meanwhile: its share of the machine, which its limit of
	// messages in flight trades against the bench topic's latency.
	var drained string
	if err := measure(fmt.Sprintf("a topic draining %d rows committed at once", b.o.Bulk), func(sc *schema) (func() error, error) {
		committed := time.Now()
		_, err := b.pool.Exec(ctx, `INSERT INTO `+sc.table+` (topic, payload)
			SELECT $1, jsonb_build_object('n', i) FROM generate_series(1, $2) AS i`, bulkTopic, b.o.Bulk)
		return func() error {
			// Its drain ends at its last sent_at when every row was sent (both times on
			// the database's clock), and with the window otherwise.
			var sent int
			var drain float64
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'sent'),
	COALESCE(EXTRACT(EPOCH FROM max(sent_at) - min(created_at)), 0)::float8
FROM `+sc.table+` WHERE topic = $1`, bulkTopic).Scan(&sent, &drain); err != nil {
				return err
			}
			window := time.Since(committed)
			if sent == b.o.Bulk && drain > 0 {
				drained = fmt.Sprintf("The bulk topic meanwhile: all %d of its rows sent in %.1f s (%.0f msg/s), within the %.1f s window.",
					sent, drain, float64(sent)/drain, window.Seconds())
			} else {
				drained = fmt.Sprintf("The bulk topic meanwhile: %d of its %d rows sent in the %.1f s window (%.0f msg/s).",
					sent, b.o.Bulk, window.Seconds(), float64(sent)/window.Seconds())
			}
			return nil
		}, err
	}); err != nil {
		return err
	}

	fmt.Fprintf(b.out, "\n| outbox run, %s at %.1f msg/s beside | messages | commit-to-sent p50 | p99 | max | p99 vs idle |\n|---|---:|---:|---:|---:|---:|\n", benchTopic, b.o.Rate)
	for _, r := range rows {
		fmt.Fprintf(b.out, "| %s | %d | %s | %s | %s | %s |\n", r.beside, b.o.LatencyMessages, ms(r.p50), ms(r.p99), ms(r.mx),
			ratio(float64(r.p99), float64(rows[0].p99)))
	}
	fmt.Fprintf(b.out, "\n%s\n", drained)
	return nil
}

// hang is the downstream of the hanging topic: it answers only when the request is
// given up (the send's timeout), when the receiver closes, or after five minutes.
func hang(w http.ResponseWriter, req *http.Request, closing <-chan struct{}) {
	select {
	case <-req.Context().Done():
	case <-closing:
	case <-time.After(5 * time.Minute):
	}
	w.WriteHeader(http.StatusGatewayTimeout)
}

// isHang reports whether a request is the hanging topic's.
func isHang(req *http.Request) bool { return strings.HasSuffix(req.URL.Path, "/hang") }
