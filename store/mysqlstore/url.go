package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/store/storedriver"
)

// Collation is the connection collation Open sets: it exists on MySQL 8 and MariaDB alike
// (MariaDB has no utf8mb4_0900_ai_ci).
const Collation = "utf8mb4_unicode_ci"

// ParseURL parses a MySQL or MariaDB connection string into a driver configuration, in
// either form:
//
//	mysql://user:password@host:3306/database?param=value   (also mariadb://)
//	user:password@tcp(host:3306)/database?param=value      (the go-sql-driver DSN)
//
// The URL's parameters are the DSN's (tls, timeout, ...). Whatever they say, the
// configuration parses times (parseTime=true) as UTC (loc=UTC), sets the session time zone
// to '+00:00', talks utf8mb4 with the collation [Collation], and counts the rows an UPDATE
// matched rather than those it changed (clientFoundRows=true), as PostgreSQL does. It
// interpolates parameters on the client (one round trip per statement) unless the URL sets
// interpolateParams. An error names the URL with its password hidden.
func ParseURL(raw string) (*mysql.Config, error) {
	cfg, err := parseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("parse MySQL URL %s: %w", redactURL(raw), err)
	}
	if cfg.DBName == "" {
		return nil, fmt.Errorf("parse MySQL URL %s: it names no database; the outbox tables live in the database the URL names, as in mysql://app@db:3306/app", redactURL(raw))
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.ClientFoundRows = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	for k := range cfg.Params {
		if strings.EqualFold(k, "time_zone") || strings.EqualFold(k, "charset") || strings.EqualFold(k, "collation") {
			delete(cfg.Params, k)
		}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	if err := cfg.Apply(mysql.Charset("utf8mb4", Collation)); err != nil {
		return nil, fmt.Errorf("parse MySQL URL %s: %w", redactURL(raw), err)
	}
	if !strings.Contains(strings.ToLower(raw), "interpolateparams=") {
		cfg.InterpolateParams = true
	}
	return cfg, nil
}

func parseURL(raw string) (*mysql.Config, error) {
	if raw == "" {
		return nil, errors.New("the URL is empty")
	}
	scheme, rest, isURL := strings.Cut(raw, "://")
	if !isURL {
		return mysql.ParseDSN(raw)
	}
	if s := strings.ToLower(scheme); s != "mysql" && s != "mariadb" {
		return nil, fmt.Errorf("the scheme must be mysql:// or mariadb://, got %s://", scheme)
	}
	u, err := url.Parse("mysql://" + rest)
	if err != nil {
		return nil, errors.New("it is not a URL (percent-encode special characters of the password)")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if strings.Contains(db, "/") {
		return nil, fmt.Errorf("the path must name one database, got %q", u.Path)
	}
	// The DSN parser reads the parameters, so both forms accept the same ones.
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, err
	}
	cfg.DBName = db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	host := u.Hostname()
	if host == "" {
		host = "127.0.0.1"
	}
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	cfg.Net = "tcp"
	cfg.Addr = net.JoinHostPort(host, port)
	return cfg, nil
}

// redactURL is raw as an error may show it: the host, not the user information (which holds
// the password), the database or the parameters.
func redactURL(raw string) string {
	if strings.Contains(raw, "://") {
		return redact.URL(raw)
	}
	// user:password@tcp(host:port)/db: keep the protocol and the address.
	head := ""
	if at := strings.LastIndex(raw, "@"); at >= 0 {
		head, raw = "(user information hidden)@", raw[at+1:]
	}
	if i := strings.Index(raw, ")"); i >= 0 { // the address may be a socket's path
		return head + raw[:i+1]
	}
	if i := strings.IndexAny(raw, "/?"); i >= 0 {
		raw = raw[:i]
	}
	return head + raw
}

// Open connects to the database of url (see [ParseURL]) and checks that it answers. The
// returned *sql.DB suits both [New] and business transactions.
func Open(ctx context.Context, url string) (*sql.DB, error) {
	cfg, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to MySQL at %s: %w", redactURL(url), err)
	}
	db := sql.OpenDB(connector)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to MySQL at %s: %w", redactURL(url), err)
	}
	return db, nil
}

// OpenDatabase opens the MySQL or MariaDB database url names (a mysql:// URL or the
// driver's DSN, as ParseURL takes) with its outbox store: it is the storedriver.Opener a
// program running the outbox from its config passes for MySQL, as in
//
//	app.Open(ctx, cfg, app.Options{Databases: map[string]app.DatabaseOpener{
//		config.DatabaseMySQL: mysqlstore.OpenDatabase,
//	}})
//
// An invalid url or payload limit, and a server that refuses the url's user or does not
// know its database, are a *storedriver.ConfigError (waiting does not mend them); a
// server that does not answer, any other error.
func OpenDatabase(ctx context.Context, url string, maxPayloadBytes int) (storedriver.Database, error) {
	if _, err := ParseURL(url); err != nil {
		return storedriver.Database{}, &storedriver.ConfigError{Err: fmt.Errorf("database_url: %w", err)}
	}
	db, err := Open(ctx, url)
	if isErrNumber(err, errAccessDenied) || isErrNumber(err, errDatabaseAccessDenied) || isErrNumber(err, errUnknownDatabase) {
		return storedriver.Database{}, &storedriver.ConfigError{Err: fmt.Errorf("database_url: %w", err)}
	}
	if err != nil {
		return storedriver.Database{}, err
	}
	st, err := New(db, Config{MaxPayloadBytes: maxPayloadBytes})
	if err != nil {
		_ = db.Close()
		return storedriver.Database{}, &storedriver.ConfigError{Err: fmt.Errorf("mysql store: %w", err)}
	}
	return storedriver.Database{
		Driver:  st,
		Enqueue: func(ctx context.Context, msg Message) (uuid.UUID, error) { return st.Enqueue(ctx, db, msg) },
		Ping:    db.PingContext,
		Close:   func() { _ = db.Close() },
	}, nil
}
