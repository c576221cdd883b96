package mysqlstore

import (
	"bytes"
	"errors"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outbox-go/outbox/store/storedriver"
)

// MySQL error numbers the store acts on.
const (
	errDatabaseAccessDenied = 1044 // ER_DBACCESS_DENIED_ERROR
	errAccessDenied         = 1045 // ER_ACCESS_DENIED_ERROR
	errUnknownDatabase      = 1049 // ER_BAD_DB_ERROR
	errBadField             = 1054 // ER_BAD_FIELD_ERROR
	errDuplicateColumn      = 1060 // ER_DUP_FIELDNAME
	errDuplicateKey         = 1062 // ER_DUP_ENTRY
	errNoSuchTable          = 1146 // ER_NO_SUCH_TABLE
	errDeadlock             = 1213 // ER_LOCK_DEADLOCK
)

// idList writes ids as a list of SQL integer literals. The ids come from the database or
// the caller as int64, so the literals are safe; they are not placeholders because a
// statement may have at most 65,535 of those.
func idList(ids []int64) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}

// uuidList writes ids as a list of SQL string literals: a formatted UUID holds only hex
// digits and dashes.
func uuidList(ids []uuid.UUID) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('\'')
		b.WriteString(id.String())
		b.WriteByte('\'')
	}
	return b.String()
}

// sqlBuilder writes a statement and collects the arguments of its placeholders in order.
type sqlBuilder struct {
	b    strings.Builder
	args []any
}

func (q *sqlBuilder) sql(s string) *sqlBuilder { q.b.WriteString(s); return q }

// in writes "col IN (?, ...)" with the values of list, or FALSE when list is empty.
func (q *sqlBuilder) in(col string, list []string) *sqlBuilder {
	if len(list) == 0 {
		q.b.WriteString("FALSE")
		return q
	}
	q.b.WriteString(col + " IN (")
	for i, v := range list {
		if i > 0 {
			q.b.WriteString(", ")
		}
		q.b.WriteByte('?')
		q.args = append(q.args, v)
	}
	q.b.WriteByte(')')
	return q
}

// String returns the statement written so far.
func (q *sqlBuilder) String() string { return q.b.String() }

// boolSQL is b as a SQL literal.
func boolSQL(b bool) string {
	if b {
		return "TRUE"
	}
	return "FALSE"
}

// isDuplicate reports whether err is a duplicate-key error on the unique index named
// index. MySQL 8 names the index as table.index, MariaDB as index; the entry's value comes
// before the index's name in the message, so the name is matched at its end.
func isDuplicate(err error, table, index string) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != errDuplicateKey {
		return false
	}
	return strings.HasSuffix(me.Message, "for key '"+index+"'") ||
		strings.HasSuffix(me.Message, "for key '"+table+"."+index+"'")
}

// isErrNumber reports whether err is the MySQL error number n.
func isErrNumber(err error, n uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == n
}

// doubleNumbers is the MySQL store's rule for the numbers of a payload: MySQL's JSON type
// keeps numbers as doubles (or 64-bit integers) and refuses one beyond the range of a
// double. PostgreSQL's jsonb stores such numbers, so this is the one payload rule the
// MySQL store adds.
var doubleNumbers = &storedriver.NumberRule{
	Fits: func(num []byte) bool {
		// Without an exponent a number below 309 digits fits a double.
		if len(num) <= 308 && !bytes.ContainsAny(num, "eE") {
			return true
		}
		_, err := strconv.ParseFloat(string(num), 64)
		return err == nil
	},
	Range: "MySQL's JSON type can store (a double)",
}
