package bench

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// laneShapes are what outbox bench --lane batch drains: the bench topic in the message
// lane and in the batch lane, both with outbox run.
func (b *bench) laneShapes() []shape {
	return []shape{
		{"message", "outbox run, lane message: one OutboxDelivery run per message", func(ctx context.Context, n int) (float64, error) {
			return b.drainWith(ctx, n, "message", "", "run")
		}},
		{laneBatch, "outbox run, lane batch: one OutboxBatch run per 100 messages", func(ctx context.Context, n int) (float64, error) {
			return b.drainWith(ctx, n, laneBatch, laneBatch, "run")
		}},
	}
}

// runLanes drains the two lanes, alternating, prints their rates and costs, then their
// commit-to-sent latency at the offered rate and at half their drain rate.
func (b *bench) runLanes(ctx context.Context) error {
	shapes := b.laneShapes()
	rates, err := b.drains(ctx, shapes)
	if err != nil {
		return err
	}
	fmt.Fprintf(b.out, "\n| lane | what | msg/s min / median / max | median vs message lane | actions/msg | events/msg |\n|---|---|---:|---:|---:|---:|\n")
	read := map[string]int{}
	for _, s := range shapes {
		if len(rates[s.name]) == 0 {
			continue
		}
		actions, events, runs, err := b.cost(ctx, s.name)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		read[s.name] = runs
		rs := rates[s.name]
		fmt.Fprintf(b.out, "| %s | %s | %s | %s | %.3f | %.2f |\n", s.name, s.what, minMedMax(rs), ratio(median(rs), median(rates["message"])), actions, events)
	}
	fmt.Fprintf(b.out, "\nactions/msg and events/msg: the message lane's over %d delivered messages' runs, the batch lane's over %d batch runs divided by the messages they carried, by Temporal Cloud's rules (docs/benchmarks.md).\n", read["message"], read[laneBatch])
	if !b.wants("latency") {
		return nil
	}

	type row struct {
		lane         string
		rate         float64
		p50, p99, mx time.Duration
	}
	var rows []row
	// The lanes that drained; both, at --rate alone, when none did (--only latency).
	drained := len(rates["message"])+len(rates[laneBatch]) > 0
	for _, s := range shapes {
		if drained && len(rates[s.name]) == 0 {
			continue
		}
		lane := ""
		if s.name == laneBatch {
			lane = laneBatch
		}
		err := func() error {
			sc, err := b.newSchema(ctx, "latency_"+s.name)
			if err != nil {
				return err
			}
			defer sc.drop()
			sc.lane = lane
			procs, err := b.startOutbox(ctx, sc, "run")
			if err != nil {
				return err
			}
			defer procs.stop()
			offered := []float64{b.o.Rate}
			if capacity := median(rates[s.name]); capacity > 0 {
				offered = append(offered, capacity/2)
			}
			for _, rate := range offered {
				p50, p99, mx, _, err := b.steady(ctx, sc, rate, b.o.LatencyMessages)
				if err != nil {
					return err
				}
				rows = append(rows, row{s.name, rate, p50, p99, mx})
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("latency, %s: %w", s.name, err)
		}
	}
	var lines []string
	for _, r := range rows {
		lines = append(lines, fmt.Sprintf("| %s | %.1f msg/s | %d | %s | %s | %s |", r.lane, r.rate, b.o.LatencyMessages, ms(r.p50), ms(r.p99), ms(r.mx)))
	}
	fmt.Fprintf(b.out, "\n| lane (outbox run) | offered rate | messages | commit-to-sent p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n%s\n", strings.Join(lines, "\n"))
	return nil
}
