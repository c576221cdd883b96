package mysqlstore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/mysqlstore"
	"github.com/outbox-go/outbox/store/storedriver"
)

func TestParseURL(t *testing.T) {
	for _, raw := range []string{
		"mysql://app:s3cret@db.example.com:3307/orders?timeout=5s",
		"mariadb://app:s3cret@db.example.com:3307/orders?timeout=5s",
		"app:s3cret@tcp(db.example.com:3307)/orders?timeout=5s&charset=latin1&time_zone=%27%2B05%3A00%27&loc=Local",
	} {
		cfg, err := mysqlstore.ParseURL(raw)
		require.NoError(t, err, raw)
		assert.Equal(t, "app", cfg.User)
		assert.Equal(t, "s3cret", cfg.Passwd)
		assert.Equal(t, "tcp", cfg.Net)
		assert.Equal(t, "db.example.com:3307", cfg.Addr)
		assert.Equal(t, "orders", cfg.DBName)
		assert.Equal(t, 5*time.Second, cfg.Timeout)
		assert.True(t, cfg.ParseTime)
		assert.Equal(t, time.UTC, cfg.Loc)
		assert.True(t, cfg.ClientFoundRows)
		assert.True(t, cfg.InterpolateParams)
		assert.Equal(t, "'+00:00'", cfg.Params["time_zone"])
		assert.Equal(t, mysqlstore.Collation, cfg.Collation)
		assert.Contains(t, cfg.FormatDSN(), "charset=utf8mb4")
		assert.NotContains(t, cfg.FormatDSN(), "latin1")
	}

	cfg, err := mysqlstore.ParseURL("mysql://root@localhost/test?interpolateParams=false")
	require.NoError(t, err)
	assert.False(t, cfg.InterpolateParams, "an explicit interpolateParams stands")
	assert.Equal(t, "localhost:3306", cfg.Addr)

	cfg, err = mysqlstore.ParseURL("mysql://u:p%40ss%2Fword@h/db")
	require.NoError(t, err)
	assert.Equal(t, "p@ss/word", cfg.Passwd)

	for _, bad := range []string{
		"postgres://app:s3cret@db.example.com/orders",
		"mysql://app:s3cret@db.example.com/a/b",
		"mysql://app:s3cret@db.example.com",
		"app:s3cret@tcp(db.example.com:3307)/",
		"mysql://app:s3cret@db.example.com/orders?parseTime=maybe",
		"app:s3cret@tcp(db.example.com:3307",
		"",
	} {
		_, err := mysqlstore.ParseURL(bad)
		require.Error(t, err, bad)
		assert.NotContains(t, err.Error(), "s3cret", bad)
		assert.Contains(t, err.Error(), "parse MySQL URL")
	}
	_, err = mysqlstore.ParseURL("mysql://app:s3cret@db.example.com/a/b")
	assert.Contains(t, err.Error(), "mysql://db.example.com")
	_, err = mysqlstore.ParseURL("app:s3cret@unix(/run/mysqld/mysqld.sock)/orders?parseTime=maybe")
	assert.Contains(t, err.Error(), "(user information hidden)@unix(/run/mysqld/mysqld.sock)")
	assert.NotContains(t, err.Error(), "s3cret")
}

func TestNewChecksTheConnection(t *testing.T) {
	dsn := newDatabase(t)
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)

	// A DSN without parseTime, and one whose session is not in UTC, are refused with the fix.
	noParse := cfg.Clone()
	noParse.ParseTime = false
	db1 := sql.OpenDB(must(mysql.NewConnector(noParse)))
	defer db1.Close()
	_, err = mysqlstore.New(db1, mysqlstore.Config{})
	require.ErrorContains(t, err, "parseTime")

	otherTZ := cfg.Clone()
	otherTZ.Params = map[string]string{"time_zone": "'+05:00'"}
	db2 := sql.OpenDB(must(mysql.NewConnector(otherTZ)))
	defer db2.Close()
	_, err = mysqlstore.New(db2, mysqlstore.Config{})
	require.ErrorContains(t, err, "+05:00")

	noDB := cfg.Clone()
	noDB.DBName = ""
	db3 := sql.OpenDB(must(mysql.NewConnector(noDB)))
	defer db3.Close()
	_, err = mysqlstore.New(db3, mysqlstore.Config{})
	require.ErrorContains(t, err, "names no database")

	_, err = mysqlstore.New(openDB(t, dsn), mysqlstore.Config{MaxPayloadBytes: storedriver.HardMaxPayloadBytes + 1})
	require.ErrorContains(t, err, "max payload bytes")

	st, err := mysqlstore.New(openDB(t, dsn), mysqlstore.Config{})
	require.NoError(t, err)
	assert.Equal(t, cfg.DBName, st.Schema())
	assert.Equal(t, "mysql", st.Kind())
	assert.Equal(t, storedriver.DefaultMaxPayloadBytes, st.MaxPayloadBytes())
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestMigrateTwiceIsANoOp(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, newDatabase(t))
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	require.NoError(t, err)

	// Concurrent migrations of one database: one applies, the others find nothing to do.
	var wg sync.WaitGroup
	results := make([][]int, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = st.Migrate(ctx) })
	}
	wg.Wait()
	migrations, err := mysqlstore.Migrations()
	require.NoError(t, err)
	var every []int
	for _, m := range migrations {
		every = append(every, m.Version)
	}
	var applied int
	for i := range results {
		require.NoError(t, errs[i])
		if len(results[i]) > 0 {
			applied++
			assert.Equal(t, every, results[i])
		}
	}
	assert.Equal(t, 1, applied)

	again, err := st.Migrate(ctx)
	require.NoError(t, err)
	assert.Empty(t, again)

	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_deployment`).Scan(&n))
	assert.Equal(t, 1, n)

	// An interrupted migration resumes, and its statements run twice without harm: the
	// CREATE statements have IF NOT EXISTS, and an ADD COLUMN whose column is there is
	// taken as done.
	mustExec(t, db, `UPDATE outbox_schema_migrations SET statements_done = 2, applied_at = NULL WHERE version = 1`)
	mustExec(t, db, `UPDATE outbox_schema_migrations SET statements_done = 0, applied_at = NULL WHERE version = 2`)
	resumed, err := st.Migrate(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, resumed)
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_deployment`).Scan(&n))
	assert.Equal(t, 1, n)

	// The unique indexes carry the names the store matches duplicate-key errors by.
	var idx int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME IN ('outbox_messages_idempotency_key_idx', 'outbox_dead_letters_message_run_key')`).Scan(&idx))
	assert.Equal(t, 3, idx) // one column, two columns
}

func TestSeedStyleInsertIsClaimed(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	mustExec(t, db, `INSERT INTO outbox_messages (topic, payload) VALUES ('order.created', '{"id":1}')`)
	mustExec(t, db, `INSERT INTO outbox_messages (topic, payload, status, retry_times, max_retry_times, next_retry_at)
VALUES ('order.paid', '{"id":2}', 'pending', 2, 5, NOW(6) - INTERVAL 1 SECOND)`)
	mustExec(t, db, `INSERT INTO outbox_messages (topic, payload, next_retry_at) VALUES ('order.later', '{"id":3}', NOW(6) + INTERVAL 1 HOUR)`)
	mustExec(t, db, `INSERT INTO outbox_messages (topic, payload, status) VALUES ('order.old', '{"id":4}', 'sent')`)

	claimed := claimAll(t, st, storedriver.OrderingRules{})
	require.Len(t, claimed, 2)
	assert.Equal(t, "order.paid", claimed[0].Topic, "delayed rows that are due come first")
	assert.Equal(t, 2, claimed[0].RetryTimes)
	assert.Equal(t, 5, *claimed[0].MaxRetryTimes)
	assert.Equal(t, "order.created", claimed[1].Topic)
	for _, c := range claimed {
		assert.NotEqual(t, uuid.Nil, c.MessageID)
		assert.WithinDuration(t, time.Now().Add(time.Minute), c.LeaseUntil, 10*time.Second)
		assert.Equal(t, time.UTC, c.LeaseUntil.Location())
	}
	row, err := st.Get(ctx, claimed[1].MessageID)
	require.NoError(t, err)
	assert.Equal(t, storedriver.StatusClaimed, row.Status)
	assert.JSONEq(t, `{"id":1}`, string(row.Payload))
	assert.Nil(t, row.OrderingKey)

	// A plain-SQL writer gets ordering numbers too, and a bad row is refused by the table.
	mustExec(t, db, `INSERT INTO outbox_messages (topic, payload, ordering_key) VALUES ('a', '{}', 'k'), ('a', '{}', 'k')`)
	var seqs []int64
	rows, err := db.QueryContext(ctx, `SELECT ordering_seq FROM outbox_messages WHERE ordering_key = 'k' ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var s int64
		require.NoError(t, rows.Scan(&s))
		seqs = append(seqs, s)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []int64{1, 2}, seqs)
	for _, bad := range []string{
		`INSERT INTO outbox_messages (topic, payload, status) VALUES ('a', '{}', 'bogus')`,
		`INSERT INTO outbox_messages (topic, payload) VALUES ('a', 'not json')`,
		`INSERT INTO outbox_messages (topic, payload, message_id) VALUES ('a', '{}', 'not-a-uuid')`,
		`INSERT INTO outbox_messages (topic, payload, max_retry_times) VALUES ('a', '{}', 101)`,
		`INSERT INTO outbox_messages (topic, payload, status) VALUES ('a', '{}', 'claimed')`,
		`INSERT INTO outbox_messages (topic, payload, ordering_key) VALUES ('a', '{}', '')`,
	} {
		_, err := db.ExecContext(ctx, bad)
		assert.Error(t, err, bad)
	}
}

func TestEnqueueInRolledBackTransactionWritesNothing(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	mustExec(t, db, `CREATE TABLE orders (id BIGINT PRIMARY KEY)`)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (1)`)
	require.NoError(t, err)
	id, err := st.Enqueue(ctx, tx, keyed("order.created", "order-1", `{"id":1}`))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())

	_, err = st.Get(ctx, id)
	require.ErrorIs(t, err, storedriver.ErrNotFound)
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_ordering_keys`).Scan(&n))
	assert.Zero(t, n, "the key's counter row rolled back too")
	assert.Empty(t, claimAll(t, st, storedriver.OrderingRules{}))

	// Committed, the message and the business row are there together.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (1)`)
	require.NoError(t, err)
	res, err := st.EnqueueMessage(ctx, tx, keyed("order.created", "order-1", `{"id":1}`))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	assert.Equal(t, int64(1), res.OrderingSeq, "the rolled-back number was given back")
	row, err := st.Get(ctx, res.MessageID)
	require.NoError(t, err)
	assert.Equal(t, storedriver.StatusPending, row.Status)
	assert.Equal(t, 7, int(row.MessageID.Version()))
}

func TestEnqueueValidates(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	retries := 101
	for name, m := range map[string]storedriver.Message{
		"topic":           msg("bad topic", `{}`),
		"payload":         msg("a", `{`),
		"max_retry_times": {Topic: "a", Payload: []byte(`{}`), MaxRetryTimes: &retries},
		"ordering_key":    {Topic: "a", Payload: []byte(`{}`), OrderingKey: "   "},
		"deliver_after":   {Topic: "a", Payload: []byte(`{}`), DeliverAfter: time.Now().AddDate(2, 0, 0)},
		"double range":    msg("a", `{"n": 1e400}`),
		"nul":             msg("a", `{"s": "\u0000"}`),
		"depth":           msg("a", strings.Repeat("[", 32)+strings.Repeat("]", 32)),
		"control in key":  {Topic: "a", Payload: []byte(`{}`), OrderingKey: "order\n42"},
	} {
		_, err := st.Enqueue(ctx, db, m)
		var verr *storedriver.ValidationError
		require.ErrorAs(t, err, &verr, name)
		want := name
		switch name {
		case "double range", "nul", "depth":
			want = "payload"
		case "control in key":
			want = "ordering_key"
		}
		assert.Equal(t, want, verr.Field, name)
	}
	require.NoError(t, st.Validate(msg("a", `{"n": 1.7976931348623157e308, "m": -12345678901234567890, "s": "1e999"}`)))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_messages`).Scan(&n))
	assert.Zero(t, n)
	// As deep as the database takes, brackets in strings not counted.
	deep := strings.Repeat(`{"a":`, mysqlstore.MaxPayloadDepth-1) + `["[[[{{{"]` + strings.Repeat("}", mysqlstore.MaxPayloadDepth-1)
	_, err := st.Enqueue(ctx, db, msg("a", deep))
	require.NoError(t, err, "the deepest payload MariaDB and MySQL store")
	mustExec(t, db, `DELETE FROM outbox_messages`)

	// Headers, a set message ID, JSONEnqueue.
	id := uuid.New()
	res, err := st.EnqueueJSON(ctx, db, storedriver.Message{Topic: "a", MessageID: id, Headers: map[string]string{"k": "v"}}, map[string]int{"x": 1})
	require.NoError(t, err)
	assert.Equal(t, id, res.MessageID)
	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"k": "v"}, row.Headers)
	assert.JSONEq(t, `{"x":1}`, string(row.Payload))
	// The same message ID again is an error, not a duplicate.
	_, err = st.Enqueue(ctx, db, storedriver.Message{Topic: "a", Payload: []byte(`{}`), MessageID: id})
	require.Error(t, err)
}

func TestIdempotencyKey(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	mustExec(t, db, `CREATE TABLE orders (id BIGINT PRIMARY KEY)`)
	first := enqueue(t, st, db, storedriver.Message{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: "order-42-created"})
	assert.False(t, first.Duplicate)

	// A duplicate in a business transaction: reported, and the transaction goes on.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (42)`)
	require.NoError(t, err)
	dup, err := st.EnqueueMessage(ctx, tx, storedriver.Message{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: "order-42-created", OrderingKey: "o"})
	require.NoError(t, err)
	assert.True(t, dup.Duplicate)
	assert.Equal(t, first.MessageID, dup.MessageID)
	other, err := st.EnqueueMessage(ctx, tx, storedriver.Message{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: "Order-42-created"})
	require.NoError(t, err)
	assert.False(t, other.Duplicate, "keys compare byte by byte")
	spaced, err := st.EnqueueMessage(ctx, tx, storedriver.Message{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: "order-42-created "})
	require.NoError(t, err)
	assert.False(t, spaced.Duplicate, "a trailing space makes another key")
	require.NoError(t, tx.Commit())
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&n))
	assert.Equal(t, 1, n)
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_messages`).Scan(&n))
	assert.Equal(t, 3, n)

	// A batch: a key held by a row, a key repeated within the batch, new keys.
	out, err := st.EnqueueBatch(ctx, db, []storedriver.Message{
		{Topic: "b", Payload: []byte(`1`), IdempotencyKey: "order-42-created"},
		{Topic: "b", Payload: []byte(`2`), IdempotencyKey: "new-1", OrderingKey: "k"},
		{Topic: "b", Payload: []byte(`3`), IdempotencyKey: "new-1", OrderingKey: "k"},
		{Topic: "b", Payload: []byte(`4`), OrderingKey: "k"},
		{Topic: "b", Payload: []byte(`5`)},
	})
	require.NoError(t, err)
	require.Len(t, out, 5)
	assert.Equal(t, storedriver.Enqueued{MessageID: first.MessageID, Duplicate: true}, out[0])
	assert.False(t, out[1].Duplicate)
	assert.Equal(t, int64(1), out[1].OrderingSeq)
	assert.Equal(t, storedriver.Enqueued{MessageID: out[1].MessageID, Duplicate: true}, out[2])
	assert.Equal(t, int64(2), out[3].OrderingSeq)
	assert.False(t, out[4].Duplicate)

	// Retention frees a key with its row.
	mustExec(t, db, `UPDATE outbox_messages SET status = 'sent', sent_at = NOW(6) - INTERVAL 2 HOUR, updated_at = NOW(6) - INTERVAL 2 HOUR WHERE message_id = ?`, first.MessageID.String())
	_, err = st.Purge(ctx, storedriver.PurgeOptions{SentAfter: time.Hour, DiscardedAfter: time.Hour})
	require.NoError(t, err)
	again := enqueue(t, st, db, storedriver.Message{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: "order-42-created"})
	assert.False(t, again.Duplicate)
}

func TestEnqueueBatchOrdersItsKeys(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	var msgs []storedriver.Message
	for i := range 6 {
		msgs = append(msgs, keyed("t", []string{"b", "a"}[i%2], fmt.Sprintf(`{"i":%d}`, i)))
	}
	msgs = append(msgs, storedriver.Message{Topic: "t", Payload: []byte(`{}`), DeliverAfter: time.Now().Add(time.Hour)})
	out, err := st.EnqueueBatch(ctx, db, msgs)
	require.NoError(t, err)
	seqs := []int64{}
	for _, o := range out {
		seqs = append(seqs, o.OrderingSeq)
	}
	assert.Equal(t, []int64{1, 1, 2, 2, 3, 3, 0}, seqs)

	_, err = st.EnqueueBatch(ctx, db, []storedriver.Message{msg("t", `{}`), msg("bad topic", `{}`)})
	var verr *storedriver.ValidationError
	require.ErrorAs(t, err, &verr)
	assert.Equal(t, "messages[1].topic", verr.Field)

	// Two transactions enqueueing the same keys in opposite orders with EnqueueBatch do not
	// deadlock; with single Enqueues they may, and the error says so.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for w := range 2 {
		wg.Go(func() {
			for range 20 {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					errs[w] = err
					return
				}
				batch := []storedriver.Message{keyed("t", "x", `{}`), keyed("t", "y", `{}`)}
				if w == 1 {
					batch[0], batch[1] = batch[1], batch[0]
				}
				if _, err := st.EnqueueBatch(ctx, tx, batch); err != nil {
					_ = tx.Rollback()
					errs[w] = err
					return
				}
				time.Sleep(time.Millisecond)
				if err := tx.Commit(); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}

func TestOrderingDeadlockIsExplained(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	tx1, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx1.Rollback()
	tx2, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx2.Rollback()
	_, err = st.Enqueue(ctx, tx1, keyed("t", "a", `{}`))
	require.NoError(t, err)
	_, err = st.Enqueue(ctx, tx2, keyed("t", "b", `{}`))
	require.NoError(t, err)
	errs := make(chan error, 2)
	go func() { _, err := st.Enqueue(ctx, tx1, keyed("t", "b", `{}`)); errs <- err }()
	time.Sleep(200 * time.Millisecond)
	go func() { _, err := st.Enqueue(ctx, tx2, keyed("t", "a", `{}`)); errs <- err }()
	e1, e2 := <-errs, <-errs
	err = errors.Join(e1, e2)
	require.Error(t, err)
	assert.ErrorIs(t, err, mysqlstore.ErrOrderingDeadlock)
	assert.ErrorIs(t, err, storedriver.ErrOrderingDeadlock)
}

func TestOrderingWithConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	const writers, each = 4, 25
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
				if err != nil {
					errs[w] = err
					return
				}
				if _, err := st.Enqueue(ctx, tx, keyed("order.event", "order-1", fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))); err != nil {
					_ = tx.Rollback()
					errs[w] = err
					return
				}
				time.Sleep(time.Duration(w) * 200 * time.Microsecond)
				if err := tx.Commit(); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))

	// Delivered one at a time in ordering_seq order, each writer's messages in its order.
	var delivered []storedriver.Row
	for len(delivered) < writers*each {
		claimed := claimAll(t, st, storedriver.OrderingRules{})
		require.Len(t, claimed, 1, "a key's messages are handed over one at a time")
		row, err := st.Get(ctx, claimed[0].MessageID)
		require.NoError(t, err)
		delivered = append(delivered, row)
		n, err := st.MarkDispatchedAll(ctx, claimed)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		ok, err := st.MarkSent(ctx, claimed[0].MessageID)
		require.NoError(t, err)
		require.True(t, ok)
	}
	last := map[int]int{}
	for i, row := range delivered {
		require.Equal(t, int64(i+1), *row.OrderingSeq, "numbers in commit order, without gaps")
		var p struct{ W, I int }
		require.NoError(t, json.Unmarshal(row.Payload, &p))
		if prev, ok := last[p.W]; ok {
			require.Greater(t, p.I, prev, "writer %d's messages out of order", p.W)
		}
		last[p.W] = p.I
	}
	assert.Empty(t, claimAll(t, st, storedriver.OrderingRules{}))
}

func TestOrderedWriterWaitsForTheFirst(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	tx1, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	r1, err := st.EnqueueMessage(ctx, tx1, keyed("t", "k", `1`))
	require.NoError(t, err)
	done := make(chan storedriver.Enqueued)
	go func() {
		tx2, err := db.BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		r2, err := st.EnqueueMessage(ctx, tx2, keyed("t", "k", `2`))
		if err != nil {
			panic(err)
		}
		if err := tx2.Commit(); err != nil {
			panic(err)
		}
		done <- r2
	}()
	select {
	case <-done:
		t.Fatal("the second writer of the key did not wait for the first")
	case <-time.After(300 * time.Millisecond):
	}
	// Another key does not wait.
	other := enqueue(t, st, db, keyed("t", "other", `3`))
	assert.Equal(t, int64(1), other.OrderingSeq)
	require.NoError(t, tx1.Commit())
	r2 := <-done
	assert.Equal(t, r1.OrderingSeq+1, r2.OrderingSeq)
}

func TestParkAndRelease(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	a := enqueue(t, st, db, keyed("order.created", "o1", `1`))
	b := enqueue(t, st, db, keyed("order.paid", "o1", `2`))
	c := enqueue(t, st, db, keyed("order.shipped", "o1", `3`))
	free := enqueue(t, st, db, msg("unkeyed", `4`))

	res, err := st.ClaimBatch(ctx, 10, time.Minute, storedriver.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 2)
	assert.Equal(t, a.MessageID, res.Claimed[0].MessageID)
	assert.Equal(t, free.MessageID, res.Claimed[1].MessageID)
	assert.Equal(t, 2, res.Parked)
	var parked int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_messages WHERE held_back`).Scan(&parked))
	assert.Equal(t, 2, parked)
	backlog, err := st.Backlog(ctx)
	require.NoError(t, err)
	pending, age := storedriver.TotalBacklog(backlog)
	assert.Equal(t, int64(4), pending, "two claimed, two parked")
	assert.Greater(t, age, time.Duration(0))

	// Nothing due while a is not delivered; sending a releases b.
	assert.Empty(t, claimAll(t, st, storedriver.OrderingRules{}))
	sent, err := st.RecordSent(ctx, a.MessageID)
	require.NoError(t, err)
	require.NotNil(t, sent)
	assert.Equal(t, "order.created", sent.Topic)
	assert.Greater(t, sent.Latency, time.Duration(0))
	claimed := claimAll(t, st, storedriver.OrderingRules{})
	require.Len(t, claimed, 1)
	assert.Equal(t, b.MessageID, claimed[0].MessageID)

	// A dead b blocks c; a topic that skips dead messages does not; discarding b releases c.
	ok, err := st.DeadLetter(ctx, storedriver.DeadLetter{MessageID: b.MessageID, WorkflowID: "wf", RunID: "run-1", Attempts: 3, LastError: "boom"})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Empty(t, claimAll(t, st, storedriver.OrderingRules{}))
	skipping := storedriver.OrderingRules{Listed: []string{"order.paid"}, Skipping: []string{"order.paid"}}
	n, err := st.Unpark(ctx, skipping)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "the sweep unparks c under rules that skip b's topic")
	mustExec(t, db, `UPDATE outbox_messages SET held_back = TRUE WHERE message_id = ?`, c.MessageID.String())
	n, err = st.Unpark(ctx, storedriver.OrderingRules{})
	require.NoError(t, err)
	assert.Zero(t, n)
	require.NoError(t, st.Discard(ctx, b.MessageID, "alice"))
	claimed = claimAll(t, st, storedriver.OrderingRules{})
	require.Len(t, claimed, 1)
	assert.Equal(t, c.MessageID, claimed[0].MessageID)

	// An unordered topic is never held back.
	d := enqueue(t, st, db, keyed("audit.log", "o1", `5`))
	claimed = claimAll(t, st, storedriver.OrderingRules{Listed: []string{"audit.log"}, Unordered: []string{"audit.log"}})
	require.Len(t, claimed, 1)
	assert.Equal(t, d.MessageID, claimed[0].MessageID)
	e := enqueue(t, st, db, keyed("other", "o1", `6`))
	res, err = st.ClaimBatch(ctx, 10, time.Minute, storedriver.OrderingRules{DefaultUnordered: true})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	assert.Equal(t, e.MessageID, res.Claimed[0].MessageID)
}

func TestDelayedDelivery(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	_, ok, err := st.NextDue(ctx)
	require.NoError(t, err)
	assert.False(t, ok)

	now := enqueue(t, st, db, msg("now", `1`))
	later := enqueue(t, st, db, storedriver.Message{Topic: "later", Payload: []byte(`2`), DeliverAfter: time.Now().Add(time.Hour)})
	past := enqueue(t, st, db, storedriver.Message{Topic: "past", Payload: []byte(`3`), DeliverAfter: time.Now().Add(-time.Minute)})
	ancient := enqueue(t, st, db, storedriver.Message{Topic: "ancient", Payload: []byte(`4`), DeliverAfter: time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)})

	wait, ok, err := st.NextDue(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	assert.InDelta(t, time.Hour.Seconds(), wait.Seconds(), 10)

	row, err := st.Get(ctx, later.MessageID)
	require.NoError(t, err)
	require.NotNil(t, row.NextRetryAt)
	assert.WithinDuration(t, time.Now().Add(time.Hour), *row.NextRetryAt, 10*time.Second)

	claimed := claimAll(t, st, storedriver.OrderingRules{})
	var ids []uuid.UUID
	for _, c := range claimed {
		ids = append(ids, c.MessageID)
	}
	assert.Equal(t, []uuid.UUID{ancient.MessageID, past.MessageID, now.MessageID}, ids, "due delayed rows first, by time, then the others")
	mustExec(t, db, `UPDATE outbox_messages SET next_retry_at = NOW(6) - INTERVAL 1 SECOND WHERE message_id = ?`, later.MessageID.String())
	claimed = claimAll(t, st, storedriver.OrderingRules{})
	require.Len(t, claimed, 1)
	assert.Equal(t, later.MessageID, claimed[0].MessageID)
}

func TestConcurrentClaimsAreDisjoint(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	const total = 300
	var msgs []storedriver.Message
	for i := range total {
		m := msg("t", fmt.Sprintf(`{"i":%d}`, i))
		if i%3 == 0 {
			m.DeliverAfter = time.Now().Add(-time.Second)
		}
		msgs = append(msgs, m)
	}
	_, err := st.EnqueueBatch(ctx, db, msgs)
	require.NoError(t, err)

	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for w := range 4 {
		wg.Go(func() {
			for {
				res, err := st.ClaimBatch(ctx, 7, time.Minute, storedriver.OrderingRules{})
				if err != nil {
					errs[w] = err
					return
				}
				if len(res.Claimed) == 0 {
					return
				}
				mu.Lock()
				for _, c := range res.Claimed {
					seen[c.MessageID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	assert.Len(t, seen, total)
	for id, n := range seen {
		assert.Equal(t, 1, n, "message %s claimed %d times", id, n)
	}
}

func TestTransitions(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	a := enqueue(t, st, db, msg("t", `1`))
	b := enqueue(t, st, db, msg("t", `2`))
	claimed := claimAll(t, st, storedriver.OrderingRules{})
	require.Len(t, claimed, 2)

	// Another actor's token does not move the row.
	ok, err := st.MarkDispatched(ctx, claimed[0].ID, uuid.New())
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = st.RetryClaimAfter(ctx, claimed[0].ID, uuid.New(), time.Second)
	require.NoError(t, err)
	assert.False(t, ok)

	// A lease that ended makes the row claimable again, under a new token.
	ok, err = st.RetryClaimAfter(ctx, claimed[1].ID, claimed[1].ClaimToken, -time.Second)
	require.NoError(t, err)
	assert.True(t, ok)
	again := claimAll(t, st, storedriver.OrderingRules{})
	require.Len(t, again, 1)
	assert.Equal(t, b.MessageID, again[0].MessageID)
	assert.NotEqual(t, claimed[1].ClaimToken, again[0].ClaimToken)
	n, err := st.MarkDispatchedAll(ctx, []storedriver.Claimed{claimed[0], claimed[1]})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the old token of b no longer holds it")
	n, err = st.MarkDispatchedAll(ctx, again)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, storedriver.StatusDispatched, status(t, st, a.MessageID))

	ok, err = st.RecordFailure(ctx, a.MessageID, 2, "downstream said \x00 no \xff")
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = st.RecordFailure(ctx, a.MessageID, 1, "older")
	require.NoError(t, err)
	assert.True(t, ok)
	row, err := st.Get(ctx, a.MessageID)
	require.NoError(t, err)
	assert.Equal(t, 2, row.RetryTimes, "retry_times never decreases")
	assert.Equal(t, "older", *row.LastError)

	sent, err := st.RecordSent(ctx, a.MessageID)
	require.NoError(t, err)
	require.NotNil(t, sent)
	sent, err = st.RecordSent(ctx, a.MessageID)
	require.NoError(t, err)
	assert.Nil(t, sent, "sent already")
	ok, err = st.MarkSent(ctx, uuid.New())
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = st.RecordFailure(ctx, a.MessageID, 3, "late")
	require.NoError(t, err)
	assert.False(t, ok, "a late failure never moves a sent row")
	ok, err = st.DeadLetter(ctx, storedriver.DeadLetter{MessageID: a.MessageID, RunID: "r", WorkflowID: "w", LastError: "late"})
	require.NoError(t, err)
	assert.False(t, ok)
	dls, err := st.DeadLetters(ctx, a.MessageID)
	require.NoError(t, err)
	assert.Empty(t, dls, "a sent row gets no dead letter")
	row, err = st.Get(ctx, a.MessageID)
	require.NoError(t, err)
	assert.Equal(t, storedriver.StatusSent, row.Status)
	require.NotNil(t, row.SentAt)

	rows, err := st.GetAll(ctx, []uuid.UUID{a.MessageID, b.MessageID, uuid.New()})
	require.NoError(t, err)
	assert.Len(t, rows, 2)
	rows, err = st.GetAll(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, rows)
	_, err = st.Get(ctx, uuid.New())
	require.ErrorIs(t, err, storedriver.ErrNotFound)

	_, err = st.ClaimBatch(ctx, 0, time.Minute, storedriver.OrderingRules{})
	require.Error(t, err)
}

func TestDeadLetterRedriveDiscard(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	m := enqueue(t, st, db, storedriver.Message{Topic: "t", Payload: []byte(`{"a":1}`), Headers: map[string]string{"h": "v"}})
	d := storedriver.DeadLetter{MessageID: m.MessageID, Topic: "ignored", WorkflowID: "wf-1", RunID: "run-1", Attempts: 4, LastError: strings.Repeat("x", 10000)}
	ok, err := st.DeadLetter(ctx, d)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = st.DeadLetter(ctx, d)
	require.NoError(t, err)
	assert.False(t, ok, "the same run again changes nothing")
	dls, err := st.DeadLetters(ctx, m.MessageID)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	assert.Equal(t, "t", dls[0].Topic)
	assert.JSONEq(t, `{"a":1}`, string(dls[0].Payload))
	assert.Equal(t, map[string]string{"h": "v"}, dls[0].Headers)
	assert.LessOrEqual(t, len(dls[0].LastError), storedriver.MaxErrorTextBytes)
	require.NotNil(t, dls[0].MessageCreatedAt)

	// Not dead: a *NotDeadError; missing: ErrNotFound; no actor: an error.
	other := enqueue(t, st, db, msg("t", `{}`))
	_, err = st.Redrive(ctx, other.MessageID, "alice")
	var nd *storedriver.NotDeadError
	require.ErrorAs(t, err, &nd)
	assert.Equal(t, storedriver.StatusPending, nd.Status)
	require.ErrorIs(t, st.Discard(ctx, uuid.New(), "alice"), storedriver.ErrNotFound)
	_, err = st.Redrive(ctx, m.MessageID, " ")
	require.Error(t, err)

	list, err := st.ListDeadLetters(ctx, storedriver.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, list, 1)
	list, err = st.ListDeadLetters(ctx, storedriver.DeadLetterFilter{Topic: "other"})
	require.NoError(t, err)
	assert.Empty(t, list)
	list, err = st.ListDeadLetters(ctx, storedriver.DeadLetterFilter{Since: time.Now().Add(-time.Minute)})
	require.NoError(t, err)
	assert.Len(t, list, 1)
	_, err = st.ListDeadLetters(ctx, storedriver.DeadLetterFilter{Limit: -1})
	require.Error(t, err)

	// Concurrent redrives: exactly one wins.
	var wg sync.WaitGroup
	results := make([]error, 4)
	for i := range results {
		wg.Go(func() { _, results[i] = st.Redrive(ctx, m.MessageID, fmt.Sprintf("op-%d", i)) })
	}
	wg.Wait()
	wins := 0
	for _, err := range results {
		if err == nil {
			wins++
		} else {
			require.ErrorAs(t, err, &nd)
		}
	}
	assert.Equal(t, 1, wins)
	row, err := st.Get(ctx, m.MessageID)
	require.NoError(t, err)
	assert.Equal(t, storedriver.StatusPending, row.Status)
	assert.Equal(t, 1, row.RedriveCount)
	assert.Zero(t, row.RetryTimes)
	list, err = st.ListDeadLetters(ctx, storedriver.DeadLetterFilter{})
	require.NoError(t, err)
	assert.Empty(t, list, "the dead letter is closed")
	list, err = st.ListDeadLetters(ctx, storedriver.DeadLetterFilter{IncludeClosed: true})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.NotNil(t, list[0].RedrivenBy)

	// A second run gives up; the operator discards.
	ok, err = st.DeadLetter(ctx, storedriver.DeadLetter{MessageID: m.MessageID, WorkflowID: "wf-1", RunID: "run-2", LastError: "again"})
	require.NoError(t, err)
	assert.True(t, ok)
	runs, err := st.DeadLetterRunIDs(ctx, m.MessageID)
	require.NoError(t, err)
	assert.Equal(t, []string{"run-1", "run-2"}, runs)
	require.NoError(t, st.Discard(ctx, m.MessageID, "bob"))
	err = st.Discard(ctx, m.MessageID, "bob")
	require.ErrorAs(t, err, &nd)
	assert.Equal(t, storedriver.StatusDiscarded, nd.Status)
	ok, err = st.DeadLetter(ctx, storedriver.DeadLetter{MessageID: m.MessageID, RunID: "run-3", WorkflowID: "wf-1"})
	require.NoError(t, err)
	assert.False(t, ok)

	audit, err := st.Audit(ctx, m.MessageID)
	require.NoError(t, err)
	require.Len(t, audit, 2)
	assert.Equal(t, "redrive", audit[0].Action)
	assert.Equal(t, "discard", audit[1].Action)
	assert.Equal(t, "bob", audit[1].Actor)
	require.NotNil(t, audit[1].DeadLetterID)
	dls, err = st.DeadLetters(ctx, m.MessageID)
	require.NoError(t, err)
	assert.Equal(t, dls[1].ID, *audit[1].DeadLetterID)

	// A dead letter for a message row that does not exist keeps the caller's topic.
	gone := uuid.New()
	ok, err = st.DeadLetter(ctx, storedriver.DeadLetter{MessageID: gone, Topic: "lost", RunID: "r", WorkflowID: "w", LastError: "x"})
	require.NoError(t, err)
	assert.False(t, ok)
	dls, err = st.DeadLetters(ctx, gone)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	assert.Equal(t, "lost", dls[0].Topic)
	assert.Equal(t, "null", string(dls[0].Payload))
}

func TestReconcile(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	a := enqueue(t, st, db, msg("t", `1`))
	b := enqueue(t, st, db, keyed("t", "k", `2`))
	c := enqueue(t, st, db, keyed("t", "k", `3`))
	claimed := claimAll(t, st, storedriver.OrderingRules{})
	require.Len(t, claimed, 2)
	_, err := st.MarkDispatchedAll(ctx, claimed)
	require.NoError(t, err)

	stale, err := st.ClaimStaleDispatched(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Empty(t, stale)
	mustExec(t, db, `UPDATE outbox_messages SET updated_at = NOW(6) - INTERVAL 2 HOUR WHERE status = 'dispatched'`)
	stale, err = st.ClaimStaleDispatched(ctx, time.Hour, 10)
	require.NoError(t, err)
	require.Len(t, stale, 2)
	again, err := st.ClaimStaleDispatched(ctx, time.Hour, 10)
	require.NoError(t, err)
	assert.Empty(t, again, "touched rows wait for age again")

	byID := map[uuid.UUID]storedriver.Dispatched{}
	for _, d := range stale {
		byID[d.MessageID] = d
		assert.False(t, d.DispatchedAt.IsZero())
	}
	ok, err := st.Repair(ctx, byID[a.MessageID], storedriver.ReconcileHandedOverAgain, "workflow missing")
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = st.Repair(ctx, byID[a.MessageID], storedriver.ReconcileHandedOverAgain, "again")
	require.NoError(t, err)
	assert.False(t, ok, "the row moved on since it was read")
	assert.Equal(t, storedriver.StatusPending, status(t, st, a.MessageID))

	ok, err = st.Repair(ctx, byID[b.MessageID], storedriver.ReconcileRecordedSent, "completed")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, storedriver.StatusSent, status(t, st, b.MessageID))
	_, err = st.Repair(ctx, byID[b.MessageID], storedriver.ReconcileRunning, "")
	require.Error(t, err)

	audit, err := st.Audit(ctx, b.MessageID)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	assert.Equal(t, "reconcile", audit[0].Action)
	assert.Equal(t, "recorded_sent: completed", *audit[0].Detail)

	// b sent releases c, and a is claimable again.
	claimed = claimAll(t, st, storedriver.OrderingRules{})
	var ids []uuid.UUID
	for _, cl := range claimed {
		ids = append(ids, cl.MessageID)
	}
	assert.ElementsMatch(t, []uuid.UUID{a.MessageID, c.MessageID}, ids)
	for _, cl := range claimed {
		if cl.MessageID == a.MessageID {
			assert.True(t, cl.MayHaveBeenSent(), "a was handed over before")
		}
	}
	stats, err := st.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), stats.RepairedLastDay)
}

func TestRetention(t *testing.T) {
	ctx := context.Background()
	for _, archive := range []bool{false, true} {
		t.Run(fmt.Sprintf("archive=%v", archive), func(t *testing.T) {
			st, db := newStore(t)
			var oldSent, newSent, discarded, dead []uuid.UUID
			for range 5 {
				oldSent = append(oldSent, enqueue(t, st, db, msg("t", `{}`)).MessageID)
				newSent = append(newSent, enqueue(t, st, db, msg("t", `{}`)).MessageID)
			}
			for i := range 2 {
				id := enqueue(t, st, db, msg("t", `{}`)).MessageID
				_, err := st.DeadLetter(ctx, storedriver.DeadLetter{MessageID: id, RunID: "r", WorkflowID: "w", LastError: "x"})
				require.NoError(t, err)
				if i == 0 {
					require.NoError(t, st.Discard(ctx, id, "op"))
					discarded = append(discarded, id)
				} else {
					dead = append(dead, id)
				}
			}
			for _, id := range append(oldSent, newSent...) {
				ok, err := st.MarkSent(ctx, id)
				require.NoError(t, err)
				require.True(t, ok)
			}
			// One old sent message had a dead letter before a redrive.
			mustExec(t, db, `INSERT INTO outbox_dead_letters (message_id, workflow_id, run_id, topic, payload, attempts, last_error)
VALUES (?, 'w', 'old-run', 't', '{}', 1, 'x')`, oldSent[0].String())
			// An orphaned dead letter, discarded long ago.
			mustExec(t, db, `INSERT INTO outbox_dead_letters (message_id, workflow_id, run_id, topic, payload, attempts, last_error, discarded_at)
VALUES (?, 'w', 'r', 't', '{}', 1, 'x', NOW(6) - INTERVAL 3 DAY)`, uuid.New().String())
			for _, id := range oldSent {
				mustExec(t, db, `UPDATE outbox_messages SET sent_at = NOW(6) - INTERVAL 2 DAY, updated_at = NOW(6) - INTERVAL 2 DAY WHERE message_id = ?`, id.String())
			}
			mustExec(t, db, `UPDATE outbox_messages SET updated_at = NOW(6) - INTERVAL 2 DAY WHERE message_id = ?`, discarded[0].String())

			_, err := st.PurgeBatch(ctx, storedriver.PurgeOptions{SentAfter: time.Second, DiscardedAfter: time.Hour})
			require.ErrorContains(t, err, "sent_after")

			opts := storedriver.PurgeOptions{SentAfter: 24 * time.Hour, DiscardedAfter: 24 * time.Hour, Archive: archive, Limit: 2}
			res, err := st.Purge(ctx, opts)
			require.NoError(t, err)
			assert.Equal(t, int64(5), res.SentMessages)
			assert.Equal(t, int64(1), res.DiscardedMessages)
			assert.Equal(t, int64(3), res.DeadLetters, "the old sent message's, the discarded message's, the orphan")
			assert.Equal(t, 4, res.Batches)
			assert.False(t, res.More)

			got, err := st.GetAll(ctx, append(append(append(oldSent, newSent...), discarded...), dead...))
			require.NoError(t, err)
			assert.Len(t, got, 6, "the recent sent and the dead ones stay")
			var archived, archivedDead, audit int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_messages_archive`).Scan(&archived))
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_dead_letters_archive`).Scan(&archivedDead))
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_audit`).Scan(&audit))
			if archive {
				assert.Equal(t, 6, archived)
				assert.Equal(t, 3, archivedDead)
				assert.Equal(t, 1, audit, "archiving keeps the audit")
				var topic, statusText string
				var seen time.Time
				require.NoError(t, db.QueryRowContext(ctx, `SELECT topic, status, archived_at FROM outbox_messages_archive WHERE message_id = ?`,
					oldSent[1].String()).Scan(&topic, &statusText, &seen))
				assert.Equal(t, "sent", statusText)
			} else {
				assert.Zero(t, archived)
				assert.Zero(t, archivedDead)
				assert.Zero(t, audit, "a deleted message takes its audit along")
			}
			var left int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_dead_letters`).Scan(&left))
			assert.Equal(t, 1, left, "the dead message's dead letter stays")
		})
	}
}

func TestStats(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	stats, err := st.Stats(ctx)
	require.NoError(t, err)
	assert.Len(t, stats.ByStatus, len(storedriver.Statuses))
	assert.Zero(t, stats.OldestPendingAge)

	a := enqueue(t, st, db, keyed("a", "k", `1`))
	enqueue(t, st, db, keyed("a", "k", `2`))
	enqueue(t, st, db, msg("b", `3`))
	enqueue(t, st, db, storedriver.Message{Topic: "b", Payload: []byte(`4`), DeliverAfter: time.Now().Add(time.Hour)})
	mustExec(t, db, `UPDATE outbox_messages SET created_at = NOW(6) - INTERVAL 10 MINUTE`)
	_, err = st.DeadLetter(ctx, storedriver.DeadLetter{MessageID: a.MessageID, RunID: "r", WorkflowID: "w", LastError: "x"})
	require.NoError(t, err)
	claimed, err := st.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	stats, err = st.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), stats.ByStatus[storedriver.StatusPending])
	assert.Equal(t, int64(1), stats.ByStatus[storedriver.StatusDead])
	assert.Equal(t, int64(1), stats.ByStatus[storedriver.StatusClaimed])
	assert.Equal(t, map[storedriver.Status]int64{storedriver.StatusDead: 1, storedriver.StatusPending: 1}, stats.ByTopic["a"])
	assert.Equal(t, int64(1), stats.InFlight)
	assert.Equal(t, int64(1), stats.OpenDeadLetters)
	assert.Equal(t, int64(1), stats.DeadLettersLastHour)
	assert.Equal(t, int64(1), stats.HeldBack)
	assert.Equal(t, int64(1), stats.KeysBlockedByDead)
	assert.Zero(t, stats.OldestPendingAge, "nothing pending is due: a's second waits behind the dead first, b's second for its time")
	assert.Less(t, stats.OldestInFlightAge, time.Minute)
	assert.WithinDuration(t, time.Now(), stats.At, 10*time.Second)
	assert.Equal(t, time.UTC, stats.At.Location())
}

func TestSessionTimeZoneOfTheWriter(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	db := openDB(t, dsn)
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	require.NoError(t, err)
	_, err = st.Migrate(ctx)
	require.NoError(t, err)

	// A business database whose sessions are in +05:00 and whose driver reads local times.
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	cfg.Params = map[string]string{"time_zone": "'+05:00'"}
	cfg.Loc = time.FixedZone("X", 3*3600)
	writer := sql.OpenDB(must(mysql.NewConnector(cfg)))
	defer writer.Close()
	var tz string
	require.NoError(t, writer.QueryRowContext(ctx, `SELECT @@session.time_zone`).Scan(&tz))
	require.Equal(t, "+05:00", tz)

	after := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	tx, err := writer.BeginTx(ctx, nil)
	require.NoError(t, err)
	delayed, err := st.Enqueue(ctx, tx, storedriver.Message{Topic: "t", Payload: []byte(`{}`), DeliverAfter: after})
	require.NoError(t, err)
	plain, err := st.Enqueue(ctx, tx, msg("t", `{}`))
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO outbox_messages (topic, payload, message_id) VALUES ('seed', '{}', ?)`, "00000000-0000-4000-8000-000000000001")
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	row, err := st.Get(ctx, delayed)
	require.NoError(t, err)
	require.NotNil(t, row.NextRetryAt)
	assert.True(t, after.Equal(*row.NextRetryAt), "next_retry_at %s, want %s", row.NextRetryAt, after)
	for _, id := range []uuid.UUID{plain, uuid.MustParse("00000000-0000-4000-8000-000000000001")} {
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), row.CreatedAt, 10*time.Second, "created_at is UTC whatever the writer's zone")
		assert.Equal(t, time.UTC, row.CreatedAt.Location())
	}
	wait, ok, err := st.NextDue(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	assert.InDelta(t, time.Hour.Seconds(), wait.Seconds(), 10)
}

func TestDeployment(t *testing.T) {
	ctx := context.Background()
	st, _ := newStore(t)
	id, tq, err := st.Deployment(ctx)
	require.NoError(t, err)
	assert.NotEqual(t, uuid.Nil, id)
	assert.Empty(t, tq)
	_, _, err = st.RecordTaskQueue(ctx, "")
	require.Error(t, err)
	id2, recorded, err := st.RecordTaskQueue(ctx, "outbox")
	require.NoError(t, err)
	assert.Equal(t, id, id2)
	assert.Equal(t, "outbox", recorded)
	_, recorded, err = st.RecordTaskQueue(ctx, "other")
	require.NoError(t, err)
	assert.Equal(t, "outbox", recorded, "the first recorded stands")
	require.NoError(t, st.MoveTaskQueue(ctx, "other"))
	_, tq, err = st.Deployment(ctx)
	require.NoError(t, err)
	assert.Equal(t, "other", tq)
	cached, err := st.DeploymentID(ctx)
	require.NoError(t, err)
	assert.Equal(t, id, cached)

	// A database never migrated.
	bare, err := mysqlstore.New(openDB(t, newDatabase(t)), mysqlstore.Config{})
	require.NoError(t, err)
	_, err = bare.DeploymentID(ctx)
	require.Error(t, err)
	assert.True(t, mysqlstore.IsDeploymentMissing(err))
	assert.ErrorIs(t, err, storedriver.ErrNotMigrated)
	assert.Contains(t, err.Error(), "outbox migrate")
}

// The sweep unparks the parked rows of every topic with room, even when the rows of a
// topic before it are locked by another transaction (SKIP LOCKED leaves them to the next
// sweep) or were unparked meanwhile.
func TestUnparkGoesOnPastALockedTopic(t *testing.T) {
	for _, locked := range []string{"a", "z"} {
		t.Run(locked, func(t *testing.T) {
			ctx := context.Background()
			st, db := newStore(t)
			ids := map[string]string{}
			for _, topic := range []string{"a", "z"} {
				ids[topic] = enqueue(t, st, db, msg(topic, `1`)).MessageID.String()
				// Parked as a claim parks a row of a topic at its limit.
				mustExec(t, db, `UPDATE outbox_messages SET held_back = TRUE WHERE message_id = ?`, ids[topic])
			}
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			// By primary key: a scan would lock every row it passed.
			var id int64
			require.NoError(t, db.QueryRowContext(ctx, `SELECT id FROM outbox_messages WHERE message_id = ?`, ids[locked]).Scan(&id))
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT id FROM outbox_messages WHERE id = ? FOR UPDATE`, id).Scan(&id))

			n, err := st.Unpark(ctx, storedriver.OrderingRules{})
			require.NoError(t, err)
			assert.Equal(t, int64(1), n)
			other := map[string]string{"a": "z", "z": "a"}[locked]
			var held bool
			require.NoError(t, db.QueryRowContext(ctx, `SELECT held_back FROM outbox_messages WHERE message_id = ?`, ids[other]).Scan(&held))
			assert.False(t, held, "topic %s's row is still parked", other)
		})
	}
}
