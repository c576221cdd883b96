// Package enqueue holds the benchmark that compares what an outbox message costs a
// business transaction with a plain row of the same data, with the steps between that row
// and the outbox table (its columns, its constraints, its indexes), and with River's
// InsertTx (github.com/riverqueue/river). It is a module of its own so that River stays
// out of the library's module graph; see docs/benchmarks.md.
package enqueue
