package config

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/outbox-go/outbox/internal/redact"
)

// The databases database_url may name.
const (
	DatabasePostgres = "postgres"
	DatabaseMySQL    = "mysql"
)

// pgKeyValue matches the start of libpq's key=value form: host=db dbname=app.
var pgKeyValue = regexp.MustCompile(`^[A-Za-z_]+\s*=`)

// mysqlNet matches what the Go MySQL driver's DSN has between the user's part and the
// database name: a network with its address in parentheses, or nothing (tcp(db:3306),
// unix(/run/mysqld/mysqld.sock)).
var mysqlNet = regexp.MustCompile(`^[a-z0-9]*(\(.*\))?$`)

// isMySQLDSN reports whether u has the Go MySQL driver's own DSN form,
// [user[:password]@][net[(addr)]]/dbname[?params], as in app:secret@tcp(db:3306)/app or
// /app. It splits u as the driver does: the database name follows the last '/', the
// user's part ends at the last '@' before it, so a password may hold either character.
func isMySQLDSN(u string) bool {
	slash := strings.LastIndex(u, "/")
	if slash < 0 {
		return false
	}
	head := u[:slash]
	if at := strings.LastIndex(head, "@"); at >= 0 {
		head = head[at+1:]
	}
	return mysqlNet.MatchString(head)
}

// DatabaseKind returns which database url names: DatabasePostgres for a postgres:// or
// postgresql:// URL, libpq's key=value form (host=db dbname=app) and the empty string
// (the PG* environment variables then say where), DatabaseMySQL for a mysql:// or
// mariadb:// URL and the Go MySQL driver's DSN form (app:secret@tcp(db:3306)/app).
// Anything else is an error that names the forms allowed, with any password left out.
func DatabaseKind(url string) (string, error) {
	u := strings.TrimSpace(url)
	lower := strings.ToLower(u)
	switch {
	case u == "", strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return DatabasePostgres, nil
	case strings.HasPrefix(lower, "mysql://"), strings.HasPrefix(lower, "mariadb://"):
		return DatabaseMySQL, nil
	case !strings.Contains(u, "://") && pgKeyValue.MatchString(u):
		return DatabasePostgres, nil
	case !strings.Contains(u, "://") && isMySQLDSN(u):
		return DatabaseMySQL, nil
	}
	return "", fmt.Errorf("%q names no database the outbox supports: use postgres://… or key=value (PostgreSQL), mysql://… or user:password@tcp(host:3306)/db (MySQL, MariaDB)", redact.Address(u))
}
