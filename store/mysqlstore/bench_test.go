package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/mysqlstore"
	"github.com/outbox-go/outbox/store/storedriver"
)

// seedRows inserts n rows into outbox_messages in one statement; values are SQL
// expressions for columns, in which n stands for the row's number (0 to n-1).
func seedRows(tb testing.TB, db *sql.DB, n int, columns, values string) {
	tb.Helper()
	digits := `(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)`
	from := make([]string, 6)
	for i := range from {
		from[i] = fmt.Sprintf("%s d%d", digits, i)
	}
	num := "(d0.d + 10 * d1.d + 100 * d2.d + 1000 * d3.d + 10000 * d4.d + 100000 * d5.d)"
	mustExec(tb, db, fmt.Sprintf(`INSERT INTO outbox_messages (%s) SELECT %s FROM %s WHERE %s < %d ORDER BY %s`,
		columns, strings.ReplaceAll(values, "{n}", num), strings.Join(from, " CROSS JOIN "), num, n, num))
}

// TestClaimStaysFlat checks the claim's plan beside 100,000 sent and 100,000 held-back
// rows: both of its SELECTs read outbox_messages_claim_idx in order (no filesort) and
// stop at the limit, and the whole claim reads about as many index entries as it claims.
func TestClaimStaysFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 200,000 rows")
	}
	ctx := context.Background()
	st, db := newStore(t)
	seedRows(t, db, 100_000, "topic, payload, status, sent_at", `'order.created', '{"order_id": 1}', 'sent', NOW(6)`)
	seedRows(t, db, 100_000, "topic, payload, ordering_key, held_back", `'order.created', '{}', CONCAT('k', {n} MOD 100), TRUE`)
	seedRows(t, db, 100, "topic, payload, next_retry_at", `'order.created', '{}', NOW(6) - INTERVAL 1 SECOND`)
	seedRows(t, db, 100, "topic, payload", `'order.created', '{}'`)
	seedRows(t, db, 1, "topic, payload, next_retry_at", `'order.created', '{}', NOW(6) + INTERVAL 1 HOUR`)
	mustExec(t, db, `ANALYZE TABLE outbox_messages`)

	delayed, immediate := st.ClaimSQL()
	for name, query := range map[string]string{"delayed": delayed, "immediate": immediate} {
		plan := explain(t, db, query, 100)
		// The claim's table, and the paused topics read once (a materialized subquery).
		require.Len(t, plan, 2, name)
		require.Equal(t, "outbox_topic_pauses", plan[1]["table"], "%s claim: %v", name, plan[1])
		require.Equal(t, "outbox_messages_claim_idx", plan[0]["key"], "%s claim: %v", name, plan[0])
		require.NotContains(t, plan[0]["Extra"], "filesort", "%s claim: %v", name, plan[0])

		// The index entries the SELECT reads: about the limit, not the table's rows.
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		before := handlerReads(t, conn)
		rows, err := conn.QueryContext(ctx, strings.TrimSuffix(query, "\nFOR UPDATE SKIP LOCKED"), 100)
		require.NoError(t, err)
		n := 0
		for rows.Next() {
			n++
		}
		require.NoError(t, rows.Err())
		read := handlerReads(t, conn) - before
		require.NoError(t, conn.Close())
		require.Equal(t, 100, n)
		require.Less(t, read, int64(400), "%s claim read %d index entries for 100 rows", name, read)
		t.Logf("%s claim: key %s, type %s, rows %s, extra %q; read %d index entries for 100 rows",
			name, plan[0]["key"], plan[0]["type"], plan[0]["rows"], plan[0]["Extra"], read)
	}
	plan := explain(t, db, st.NextDueSQL())
	require.NotEqual(t, "ALL", plan[0]["type"], "NextDue: %v", plan[0])
	// MIN of the index's second column for one value of its first is found while the
	// statement is planned, one probe of the claim index: the plan shows no key then.
	require.True(t, plan[0]["key"] == "outbox_messages_claim_idx" || strings.Contains(plan[0]["Extra"], "optimized away"),
		"NextDue reads the claim index: %v", plan[0])
	loose := false
	for _, step := range explain(t, db, st.UnparkHeadsSQL()) {
		t.Logf("sweep: table %s, key %s, type %s, rows %s, extra %q", step["table"], step["key"], step["type"], step["rows"], step["Extra"])
		loose = loose || strings.Contains(step["Extra"], "Using index for group-by")
	}
	require.True(t, loose, "the sweep finds each key's first parked row with a loose index scan")
	began := time.Now()
	n, err := st.Unpark(ctx, storedriver.OrderingRules{})
	require.NoError(t, err)
	t.Logf("sweep of 100 keys with 1,000 parked rows each: %s, unparked %d", time.Since(began), n)

	began = time.Now()
	res, err := st.ClaimBatch(ctx, 200, time.Minute, storedriver.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 200)
	t.Logf("claim of 200 rows beside 100,000 sent and 100,000 held-back rows: %s", time.Since(began))
}

// explain returns the rows of EXPLAIN query, each column by name.
func explain(t testing.TB, db *sql.DB, query string, args ...any) []map[string]string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "EXPLAIN "+query, args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}

// handlerReads is the session's count of index entries read (Handler_read_key, _next,
// _prev, _first).
func handlerReads(t testing.TB, conn *sql.Conn) int64 {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), `SHOW SESSION STATUS WHERE Variable_name IN
  ('Handler_read_key', 'Handler_read_next', 'Handler_read_prev', 'Handler_read_first')`)
	require.NoError(t, err)
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name string
		var v int64
		require.NoError(t, rows.Scan(&name, &v))
		total += v
	}
	require.NoError(t, rows.Err())
	return total
}

// BenchmarkClaim measures one claim of 100 rows beside 1,000 and 100,000 sent rows, and
// beside 100,000 rows held back behind a dead message of their key or delayed by an hour.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		seed func(b *testing.B, st *mysqlstore.Store, db *sql.DB)
	}{
		{"Sent1000", func(b *testing.B, _ *mysqlstore.Store, db *sql.DB) {
			seedRows(b, db, 1_000, "topic, payload, status, sent_at", `'order.created', '{}', 'sent', NOW(6)`)
		}},
		{"Sent100000", func(b *testing.B, _ *mysqlstore.Store, db *sql.DB) {
			seedRows(b, db, 100_000, "topic, payload, status, sent_at", `'order.created', '{}', 'sent', NOW(6)`)
		}},
		{"HeldBack100000", func(b *testing.B, st *mysqlstore.Store, db *sql.DB) {
			res := enqueue(b, st, db, keyed("order.created", "k", `{}`))
			mustExec(b, db, `UPDATE outbox_messages SET status = 'dead' WHERE message_id = ?`, res.MessageID.String())
			seedRows(b, db, 100_000, "topic, payload, ordering_key", `'order.created', '{}', 'k'`)
		}},
		{"Delayed100000", func(b *testing.B, _ *mysqlstore.Store, db *sql.DB) {
			seedRows(b, db, 100_000, "topic, payload, next_retry_at", `'order.created', '{}', NOW(6) + INTERVAL 1 HOUR`)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			st, db := newStore(b)
			tc.seed(b, st, db)
			seedRows(b, db, 100, "topic, payload", `'order.created', '{"order_id": 1}'`)
			// The first claims park the held-back rows (the recheck parks a key's rows at
			// once); the benchmark measures the claims after that.
			for {
				res, err := st.ClaimBatch(ctx, 100, time.Minute, storedriver.OrderingRules{})
				require.NoError(b, err)
				resetClaimed(b, db)
				if res.Parked == 0 {
					break
				}
			}
			mustExec(b, db, `ANALYZE TABLE outbox_messages`)
			waitForPurge(b, db)
			b.ResetTimer()
			for range b.N {
				claimed, err := st.Claim(ctx, 100, time.Minute)
				require.NoError(b, err)
				require.Len(b, claimed, 100)
				b.StopTimer()
				resetClaimed(b, db)
				b.StartTimer()
			}
		})
	}
}

// waitForPurge waits (up to a minute) until InnoDB has purged the old versions of the rows
// the seeding and the parking changed and written their pages, as it does in the
// background of a running system (PostgreSQL's benchmark runs VACUUM for the same
// reason): until then the claim's index still holds their delete-marked entries, and the
// page writes compete with the claims' commits for the disk.
func waitForPurge(b *testing.B, db *sql.DB) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var n int64
		err := db.QueryRowContext(context.Background(),
			`SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'`).Scan(&n)
		var name string
		var dirty int64
		if err == nil {
			err = db.QueryRowContext(context.Background(), `SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'`).Scan(&name, &dirty)
		}
		if err != nil || (n < 100 && dirty < 100) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func resetClaimed(b *testing.B, db *sql.DB) {
	mustExec(b, db, `UPDATE outbox_messages SET status = 'pending', claim_token = NULL, lease_until = NULL WHERE status = 'claimed'`)
}

// enqueueRounds and enqueueSlice are how many times BenchmarkEnqueue measures each kind of
// transaction, and for how long each time.
const (
	enqueueRounds = 15
	enqueueSlice  = 500 * time.Millisecond
)

// BenchmarkEnqueue compares, in the same run, business transactions that insert one
// business row and then a second row: a row of a table with only a primary key (what any
// second INSERT costs, as in the PostgreSQL benchmark), the message's data in a plain
// table with a primary key and nothing else (the limit for the data itself),
// mysqlstore.Store.Enqueue, and Enqueue with an ordering key (a new key each time). As
// the PostgreSQL benchmark does, it measures each kind's transactions per second for half
// a second, every kind in turn, each round in an order shifted by one (15 rounds here, 25
// there), so a drift of the server falls on every kind alike; the metrics are the medians of each
// kind's mean time per transaction and of the ratios taken within each round. Writers1
// runs one writer, Parallel4 4 writers per core, as the PostgreSQL benchmark does. Each
// takes about half a minute, longer than the default -benchtime, so the testing package
// runs it once.
func BenchmarkEnqueue(b *testing.B) {
	for _, parallel := range []int{0, 4} {
		name, writers := "Writers1", 1
		if parallel > 0 {
			name, writers = fmt.Sprintf("Parallel%d", parallel), parallel*runtime.GOMAXPROCS(0)
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			st, db := newStore(b)
			db.SetMaxOpenConns(writers + 4)
			db.SetMaxIdleConns(writers + 4)
			mustExec(b, db, `CREATE TABLE orders (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(64) NOT NULL,
  total DECIMAL(12, 2) NOT NULL, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB`)
			mustExec(b, db, `CREATE TABLE bare_rows (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY) ENGINE = InnoDB`)
			mustExec(b, db, `CREATE TABLE message_rows (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  message_id CHAR(36) CHARACTER SET ascii NOT NULL, topic VARCHAR(200) NOT NULL, payload JSON NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'pending', created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB`)
			payload := []byte(`{"order_id": 42, "customer": "c-17", "total": "99.90", "items": [{"sku": "a", "qty": 2}]}`)
			var seq atomic.Int64
			business := func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO orders (customer, total) VALUES (?, ?)`, "c-17", "99.90")
				return err
			}
			kinds := []func(tx *sql.Tx) error{
				func(tx *sql.Tx) error { // bare second row
					_, err := tx.ExecContext(ctx, `INSERT INTO bare_rows () VALUES ()`)
					return err
				},
				func(tx *sql.Tx) error { // the message's data, nothing else
					id, err := uuid.NewV7()
					if err != nil {
						return err
					}
					_, err = tx.ExecContext(ctx, `INSERT INTO message_rows (message_id, topic, payload) VALUES (?, ?, ?)`,
						id.String(), "order.created", string(payload))
					return err
				},
				func(tx *sql.Tx) error { // outbox message
					_, err := st.Enqueue(ctx, tx, storedriver.Message{Topic: "order.created", Payload: payload})
					return err
				},
				func(tx *sql.Tx) error { // outbox message with an ordering key (a new key each time)
					_, err := st.Enqueue(ctx, tx, storedriver.Message{Topic: "order.created", Payload: payload,
						OrderingKey: fmt.Sprintf("order-%d", seq.Add(1))})
					return err
				},
			}
			transaction := func(second func(tx *sql.Tx) error) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if err := business(tx); err != nil {
					_ = tx.Rollback()
					return err
				}
				if err := second(tx); err != nil {
					_ = tx.Rollback()
					return err
				}
				return tx.Commit()
			}
			// measure runs kind k's transactions from all writers for one slice and
			// returns the mean time per transaction: the slice over how many committed.
			measure := func(k int) float64 {
				var done atomic.Int64
				var wg sync.WaitGroup
				began := time.Now()
				deadline := began.Add(enqueueSlice)
				for range writers {
					wg.Go(func() {
						for time.Now().Before(deadline) {
							if err := transaction(kinds[k]); err != nil {
								b.Error(err)
								return
							}
							done.Add(1)
						}
					})
				}
				wg.Wait()
				return float64(time.Since(began).Nanoseconds()) / float64(max(done.Load(), 1))
			}
			var ns [4][]float64
			var outboxBare, outboxSame, orderedBare []float64
			b.ResetTimer()
			for round := range enqueueRounds {
				var times [4]float64
				for i := range kinds {
					k := (round + i) % len(kinds)
					times[k] = measure(k)
				}
				for k := range kinds {
					ns[k] = append(ns[k], times[k])
				}
				outboxBare = append(outboxBare, times[2]/times[0])
				outboxSame = append(outboxSame, times[2]/times[1])
				orderedBare = append(orderedBare, times[3]/times[0])
			}
			b.StopTimer()
			median := func(xs []float64) float64 {
				xs = slices.Clone(xs)
				slices.Sort(xs)
				return xs[len(xs)/2]
			}
			b.ReportMetric(median(ns[0])/1e3, "bare-µs/tx")
			b.ReportMetric(median(ns[1])/1e3, "same-µs/tx")
			b.ReportMetric(median(ns[2])/1e3, "outbox-µs/tx")
			b.ReportMetric(median(ns[3])/1e3, "ordered-µs/tx")
			b.ReportMetric(median(outboxBare), "outbox/bare")
			b.ReportMetric(median(outboxSame), "outbox/same")
			b.ReportMetric(median(orderedBare), "ordered/bare")
		})
	}
}

// TestLimitedTopicStaysFlat checks that rows parked for their topic's limit of messages in
// flight cost the claim nothing however many there are: beside 100,000 of them, the claim
// of another topic's rows reads about as many index entries as it claims, and the
// unparking that runs before it finds the parked rows' topics one index probe each (a
// loose index scan) and a topic's oldest rows in one range.
func TestLimitedTopicStaysFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 100,000 rows")
	}
	ctx := context.Background()
	st, db := newStore(t)
	seedRows(t, db, 100_000, "topic, payload, held_back", `CONCAT('bulk-', {n} MOD 3), '{}', TRUE`)
	seedRows(t, db, 100, "topic, payload, status, dispatched_at", `CONCAT('bulk-', {n} MOD 3), '{}', 'dispatched', NOW(6)`)
	seedRows(t, db, 20, "topic, payload", `'order.created', '{}'`)
	mustExec(t, db, `ANALYZE TABLE outbox_messages`)

	loose := false
	for _, step := range explain(t, db, st.ParkedTopicsSQL()) {
		t.Logf("parked topics: table %s, key %s, type %s, rows %s, extra %q", step["table"], step["key"], step["type"], step["rows"], step["Extra"])
		loose = loose || strings.Contains(step["Extra"], "Using index for group-by")
	}
	require.True(t, loose, "the parked rows' topics are found with a loose index scan")
	plan := explain(t, db, st.ParkedOfTopicSQL(), "bulk-1", 10)
	require.Equal(t, "outbox_messages_held_back_idx", plan[0]["key"], "a topic's oldest parked rows: %v", plan[0])
	require.NotContains(t, plan[0]["Extra"], "filesort", "a topic's oldest parked rows: %v", plan[0])

	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	before := handlerReads(t, conn)
	rows, err := conn.QueryContext(ctx, st.ParkedTopicsSQL())
	require.NoError(t, err)
	var topics []string
	for rows.Next() {
		var topic string
		require.NoError(t, rows.Scan(&topic))
		topics = append(topics, topic)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"bulk-0", "bulk-1", "bulk-2"}, topics)
	read := handlerReads(t, conn) - before
	require.Less(t, read, int64(100), "finding 3 topics among 100,000 parked rows read %d index entries", read)

	// Each bulk topic has about 33 rows in flight under a limit of 30: nothing to unpark,
	// and the claim takes the other topic's rows.
	began := time.Now()
	res, err := st.ClaimBatch(ctx, 200, time.Minute, storedriver.OrderingRules{MaxInFlight: 30})
	require.NoError(t, err)
	require.Equal(t, 20, len(res.Claimed))
	require.Zero(t, res.Parked)
	t.Logf("claim of 20 rows beside 100,000 rows parked for their topic's limit: %s", time.Since(began))
}
