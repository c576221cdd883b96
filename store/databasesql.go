package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// SQLQuerier is what database/sql's *sql.Tx, *sql.Conn and *sql.DB have in common.
type SQLQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQLTx returns tx, a transaction of database/sql on PostgreSQL, as a DB, so business code
// that runs on database/sql (with pgx's stdlib driver, lib/pq or any other PostgreSQL
// driver) enqueues in its own transaction:
//
//	tx, err := db.BeginTx(ctx, nil)
//	// ... the business rows, with tx ...
//	id, err := store.Enqueue(ctx, store.SQLTx(tx), store.Message{Topic: "order.created", Payload: payload})
//	// ... tx.Commit()
//
// It serves the enqueue functions ([Store.Enqueue], [Store.EnqueueMessage],
// [Store.EnqueueJSON], [Store.EnqueueBatch] and [Enqueue]): their arguments go as text,
// which every driver sends and PostgreSQL parses into the columns' types, and their
// results come back through database/sql's scanning.
func SQLTx(tx SQLQuerier) DB { return sqlDB{tx} }

// sqlDB is a SQLQuerier as a DB.
type sqlDB struct{ q SQLQuerier }

func (d sqlDB) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	args, err := sqlArgs(args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	res, err := d.q.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, nil // the statement ran; the driver cannot count its rows
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}

func (d sqlDB) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	args, err := sqlArgs(args)
	if err != nil {
		return nil, err
	}
	rows, err := d.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return &sqlRows{rows: rows}, nil
}

func (d sqlDB) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	args, err := sqlArgs(args)
	if err != nil {
		return sqlRow{err: err}
	}
	return sqlRow{row: d.q.QueryRowContext(ctx, query, args...)}
}

// sqlRow is a *sql.Row as a pgx.Row: no row is pgx.ErrNoRows, as the package's callers
// expect.
type sqlRow struct {
	row *sql.Row
	err error
}

func (r sqlRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	err := r.row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}

// sqlRows is *sql.Rows as pgx.Rows, as far as database/sql can tell: column names but no
// types, no raw values, no connection.
type sqlRows struct {
	rows   *sql.Rows
	closed bool
}

func (r *sqlRows) Close() {
	if !r.closed {
		r.closed = true
		_ = r.rows.Close() // Err reports what went wrong while reading
	}
}

func (r *sqlRows) Err() error { return r.rows.Err() }

func (r *sqlRows) CommandTag() pgconn.CommandTag { return pgconn.CommandTag{} }

func (r *sqlRows) FieldDescriptions() []pgconn.FieldDescription {
	names, err := r.rows.Columns()
	if err != nil {
		return nil
	}
	fds := make([]pgconn.FieldDescription, len(names))
	for i, name := range names {
		fds[i].Name = name
	}
	return fds
}

func (r *sqlRows) Next() bool {
	if r.rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *sqlRows) Scan(dest ...any) error { return r.rows.Scan(dest...) }

func (r *sqlRows) Values() ([]any, error) {
	names, err := r.rows.Columns()
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(names))
	ptrs := make([]any, len(names))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := r.rows.Scan(ptrs...); err != nil {
		return nil, err
	}
	return vals, nil
}

func (r *sqlRows) RawValues() [][]byte { return nil }

func (r *sqlRows) Conn() *pgx.Conn { return nil }

// TypeMap is pgx's default map: database/sql decoded the values, not a pgx connection.
func (r *sqlRows) TypeMap() *pgtype.Map { return defaultTypeMap }

var defaultTypeMap = pgtype.NewMap()

// sqlArgs turns the arguments the package passes pgx into ones every database/sql driver
// for PostgreSQL sends as text: UUIDs and JSON as strings (a []byte would go as bytea,
// which a jsonb parameter refuses), and slices as array literals.
func sqlArgs(args []any) ([]any, error) {
	out := make([]any, len(args))
	for i, a := range args {
		v, err := sqlArg(a)
		if err != nil {
			return nil, fmt.Errorf("argument $%d: %w", i+1, err)
		}
		out[i] = v
	}
	return out, nil
}

func sqlArg(a any) (any, error) {
	switch v := a.(type) {
	case pgtype.UUID:
		if !v.Valid {
			return nil, nil
		}
		return uuid.UUID(v.Bytes).String(), nil
	case []byte:
		if v == nil {
			return nil, nil
		}
		return string(v), nil
	case []pgtype.UUID:
		return arrayLiteral(v, func(u pgtype.UUID) (string, bool) { return uuid.UUID(u.Bytes).String(), u.Valid }), nil
	case []string:
		return arrayLiteral(v, func(s string) (string, bool) { return s, true }), nil
	case []*string:
		return arrayLiteral(v, func(s *string) (string, bool) { return deref(s) }), nil
	case []*int:
		return arrayLiteral(v, func(n *int) (string, bool) {
			if n == nil {
				return "", false
			}
			return strconv.Itoa(*n), true
		}), nil
	case []*time.Time:
		return arrayLiteral(v, func(t *time.Time) (string, bool) {
			if t == nil {
				return "", false
			}
			// As pgx sends a time: in UTC, cut to PostgreSQL's microseconds (the server
			// would round the text's nanoseconds).
			return t.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano), true
		}), nil
	case string, *string, int, *int, int64, *int64, time.Time, *time.Time, bool, nil:
		return a, nil
	}
	return nil, fmt.Errorf("a %T cannot be sent through database/sql", a)
}

func deref(s *string) (string, bool) {
	if s == nil {
		return "", false
	}
	return *s, true
}

// arrayLiteral is vs as PostgreSQL's text form of an array: every element quoted, NULL
// where text reports none.
func arrayLiteral[T any](vs []T, text func(T) (string, bool)) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(',')
		}
		s, ok := text(v)
		if !ok {
			b.WriteString("NULL")
			continue
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
