package devserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/persistence/sql/sqlplugin/postgresql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin/postgresql/driver"
	pqsession "go.temporal.io/server/common/persistence/sql/sqlplugin/postgresql/session"
	"go.temporal.io/server/common/resolver"
	postgresv12 "go.temporal.io/server/schema/postgresql/v12"
	"go.temporal.io/server/tools/common/schema"
	sqltool "go.temporal.io/server/tools/sql"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/outbox-go/outbox/cmd/outbox/internal/dev"
	"github.com/outbox-go/outbox/internal/redact"
	"github.com/outbox-go/outbox/internal/temporalx"
	"github.com/outbox-go/outbox/workflows"
)

// visibilitySuffix names the visibility database after the default store's.
const visibilitySuffix = "_visibility"

// defaultPostgresDatabase is the default store's database when the URL names none.
const defaultPostgresDatabase = "temporal"

// maintenanceDatabase is the database the server's tooling connects to to create the
// other two.
const maintenanceDatabase = "postgres"

// postgresDatabaseName is a database name that needs no quoting (the server's tooling
// does not quote every name it uses) and leaves room for visibilitySuffix within
// PostgreSQL's 63 bytes.
var postgresDatabaseName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,51}$`)

// postgresStores are the two databases of a Temporal server persisting to PostgreSQL.
type postgresStores struct {
	main, visibility *config.SQL
	password         string // scrubbed from every error
}

// parsePostgresURL turns postgres://user:password@host:port/name?attr=value into the
// server's SQL settings: the default store in database name (temporal when the URL names
// none), visibility in name_visibility, every query parameter a connect attribute
// (sslmode and so on). Errors name the flag and the URL without its password.
func parsePostgresURL(raw string) (*postgresStores, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s %s: %s", dev.PostgresFlag, describePostgresURL(raw), fmt.Sprintf(format, args...))
	}
	// Not url.Parse's error: it quotes the whole URL, password included.
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fail("want a URL postgres://user[:password]@host[:port]/database[?sslmode=...]")
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return nil, fail("the URL names no host")
	}
	if port == "" {
		port = "5432"
	}
	name := strings.TrimPrefix(u.Path, "/")
	switch {
	case name == "":
		name = defaultPostgresDatabase
	case slices.Contains([]string{"postgres", "template0", "template1"}, name):
		return nil, fail("the Temporal server needs databases of its own, not %q; name one, e.g. postgres://%s/temporal (it and temporal%s are created when missing)", name, net.JoinHostPort(host, port), visibilitySuffix)
	case !postgresDatabaseName.MatchString(name):
		return nil, fail("database name %q: use lower-case letters, digits and _, at most 52 of them (the visibility store is %q)", name, name+visibilitySuffix)
	}
	cfg := &config.SQL{
		PluginName:        postgresql.PluginName,
		ConnectAddr:       net.JoinHostPort(host, port),
		ConnectProtocol:   "tcp",
		DatabaseName:      name,
		ConnectAttributes: map[string]string{},
		// Each of the four services has its own pools: 4 x 10 here and 3 x 5 for
		// visibility stay well below PostgreSQL's default max_connections of 100, and
		// are plenty for one history shard.
		MaxConns:        10,
		MaxIdleConns:    10,
		MaxConnLifetime: time.Hour,
	}
	var password string
	if u.User != nil {
		cfg.User = u.User.Username()
		password, _ = u.User.Password()
		cfg.Password = password
	}
	for k, vs := range u.Query() {
		if len(vs) != 1 {
			return nil, fail("query parameter %s is given %d times", k, len(vs))
		}
		cfg.ConnectAttributes[k] = vs[0]
	}
	vis := *cfg
	vis.DatabaseName = name + visibilitySuffix
	vis.MaxConns, vis.MaxIdleConns = 5, 5
	vis.ConnectAttributes = map[string]string{}
	for k, v := range cfg.ConnectAttributes {
		vis.ConnectAttributes[k] = v
	}
	return &postgresStores{main: cfg, visibility: &vis, password: password}, nil
}

// describePostgresURL describes a URL without its password.
func describePostgresURL(raw string) string {
	if d := dev.RedactURL(raw); d != "unparsable" {
		return d
	}
	return redact.URL(raw)
}

// describe names the two databases without the password.
func (s *postgresStores) describe() string {
	return fmt.Sprintf("PostgreSQL %s@%s, databases %s and %s", s.main.User, s.main.ConnectAddr, s.main.DatabaseName, s.visibility.DatabaseName)
}

// scrub removes the password from err's message, should a driver quote it.
func (s *postgresStores) scrub(err error) error {
	if err == nil || s.password == "" {
		return err
	}
	msg := err.Error()
	for _, p := range []string{s.password, url.QueryEscape(s.password), url.PathEscape(s.password)} {
		msg = strings.ReplaceAll(msg, p, "[redacted]")
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// prepare creates the two databases when they are missing and brings their schemas to
// the versions this server needs, with the server's own schema tooling (what
// temporal-sql-tool create-database, setup-schema -v 0.0 and update-schema do). On a
// database already at that version it only reads the version.
func (s *postgresStores) prepare(logger log.Logger) error {
	for _, store := range []struct {
		cfg          *config.SQL
		schema, want string
	}{
		{s.main, "postgresql/v12/temporal", postgresv12.Version},
		{s.visibility, "postgresql/v12/visibility", postgresv12.VisibilityVersion},
	} {
		if err := prepareStore(store.cfg, store.schema, store.want, logger); err != nil {
			return s.scrub(fmt.Errorf("%s database %s on %s: %w", dev.PostgresFlag, store.cfg.DatabaseName, store.cfg.ConnectAddr, err))
		}
	}
	return nil
}

func prepareStore(cfg *config.SQL, schemaName, want string, logger log.Logger) error {
	// The tooling's connections report a failure to connect only as "no usable database
	// connection found" (the cause goes to the log): connect once first for a clear error.
	if err := ping(cfg); err != nil {
		if !strings.Contains(err.Error(), fmt.Sprintf("database %q does not exist", cfg.DatabaseName)) {
			return fmt.Errorf("connect: %w", err)
		}
		maintenance := *cfg
		maintenance.DatabaseName = maintenanceDatabase
		if err := ping(&maintenance); err != nil {
			return fmt.Errorf("it does not exist, and connecting to the %s database to create it failed: %w", maintenanceDatabase, err)
		}
		// DoCreateDatabase connects to defaultDb through its argument.
		maintenance.DatabaseName = cfg.DatabaseName
		if err := sqltool.DoCreateDatabase(&maintenance, maintenanceDatabase, logger); err != nil {
			return fmt.Errorf("create it: %w", err)
		}
	}
	conn, err := sqltool.NewConnection(cfg, logger)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	if v, err := conn.ReadSchemaVersion(); err == nil && v == want {
		return nil
	}
	if err := schema.NewSetupSchemaTask(conn, &schema.SetupConfig{InitialVersion: "0.0"}, logger).Run(); err != nil {
		return fmt.Errorf("set up the schema: %w", err)
	}
	if err := schema.NewUpdateSchemaTask(conn, &schema.UpdateConfig{DBName: cfg.DatabaseName, SchemaName: schemaName}, logger).Run(); err != nil {
		return fmt.Errorf("update the schema to %s: %w", want, err)
	}
	return nil
}

// ping connects to cfg's database the way the server does, and disconnects.
func ping(cfg *config.SQL) error {
	s, err := pqsession.NewSession(cfg, &driver.PQDriver{}, resolver.NewNoopResolver())
	if err != nil {
		return err
	}
	s.Close()
	return nil
}

// persistence is the server's persistence on the two databases.
func (s *postgresStores) persistence() config.Persistence {
	return config.Persistence{
		DefaultStore:     "postgres",
		VisibilityStore:  "postgres-visibility",
		NumHistoryShards: 1,
		DataStores: map[string]config.DataStore{
			"postgres":            {SQL: s.main},
			"postgres-visibility": {SQL: s.visibility},
		},
	}
}

// registerNamespace creates the namespace through the frontend unless it exists (a SQL
// store with a server that runs takes namespaces the way a production one does), adds
// the outbox's search attributes to it through the operator service, and waits until the
// frontend's namespace cache has them, so a workflow started right after may use them.
func (t *TemporalServer) registerNamespace(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.DialContext(ctx, client.Options{
		HostPort: t.address, Namespace: o.Namespace,
		Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		return fmt.Errorf("connect to the Temporal server: %w", err)
	}
	defer c.Close()
	// The services may take a moment to find each other after Start.
	err = retryUnavailable(ctx, func() error {
		_, err := c.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
			Namespace:                        o.Namespace,
			WorkflowExecutionRetentionPeriod: durationpb.New(o.Retention),
		})
		var exists *serviceerror.NamespaceAlreadyExists
		if errors.As(err, &exists) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("register namespace %s: %w", o.Namespace, err)
	}
	if err := retryUnavailable(ctx, func() error { return temporalx.EnsureSearchAttributes(ctx, c, o.Namespace) }); err != nil {
		return err
	}
	for {
		resp, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: o.Namespace, WeakConsistency: true})
		if err == nil && hasAliases(resp.GetConfig().GetCustomSearchAttributeAliases()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s: the server's namespace cache does not show search attributes %s: %w", o.Namespace, strings.Join(workflows.SearchAttributeNames, ", "), cmpErr(err, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// hasAliases reports whether a namespace's field-to-alias map names every search
// attribute of the outbox.
func hasAliases(fieldToAlias map[string]string) bool {
	have := map[string]bool{}
	for _, alias := range fieldToAlias {
		have[alias] = true
	}
	for _, name := range workflows.SearchAttributeNames {
		if !have[name] {
			return false
		}
	}
	return true
}

// retryUnavailable calls f until it succeeds, fails with anything but Unavailable (or
// NamespaceNotFound, while the namespace caches catch up), or ctx ends.
func retryUnavailable(ctx context.Context, f func() error) error {
	for {
		err := f()
		var unavailable *serviceerror.Unavailable
		var notFound *serviceerror.NamespaceNotFound
		if err == nil || !(errors.As(err, &unavailable) || errors.As(err, &notFound)) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}
