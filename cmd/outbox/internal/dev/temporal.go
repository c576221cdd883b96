package dev

import (
	"cmp"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// PostgresFlag is the flag of outbox dev that sets TemporalOptions.PostgresURL.
const PostgresFlag = "--temporal-postgres"

// TemporalOptions configures the Temporal server outbox dev starts: the built-in one (every
// field applies) or the Temporal CLI's development server (IP, FrontendPort,
// FrontendHTTPPort, DatabaseFile, Namespace, UIIP, UIPort and LogFile apply).
type TemporalOptions struct {
	// IP the services bind to. Defaults to 127.0.0.1.
	IP string
	// FrontendPort defaults to 7233; HistoryPort, MatchingPort and WorkerPort to the
	// three ports after it. FrontendHTTPPort (the HTTP API, which Nexus needs) is a free
	// port when 0, as with the Temporal CLI's development server.
	FrontendPort, HistoryPort, MatchingPort, WorkerPort, FrontendHTTPPort int
	// DatabaseFile keeps the server's state; empty means a throwaway file (on tmpfs when
	// the machine has one) removed at Stop.
	DatabaseFile string
	// PostgresURL, when set, keeps the state in PostgreSQL instead of SQLite (DatabaseFile
	// is then unused), as a production server does: postgres://user:password@host:port/name
	// with the default store in database name (temporal when the URL names none) and
	// visibility in name_visibility, both created when missing, their schemas set up or
	// updated at start; query parameters (sslmode, ...) are connect attributes. The
	// namespace is then registered through the frontend after start, and the outbox's
	// search attributes added through the operator service.
	PostgresURL string
	// Namespace is created at every start. Defaults to "default".
	Namespace string
	// Retention of closed workflows in Namespace (when it is created). Defaults to 7 days.
	Retention time.Duration
	// UIIP and UIPort serve the Web UI; UIPort 0 turns it off.
	UIIP   string
	UIPort int
	// LogFile receives the server's logs (warnings and errors).
	LogFile string
}

// WithDefaults sets every field left zero to its default.
func (o *TemporalOptions) WithDefaults() {
	if o.IP == "" {
		o.IP = "127.0.0.1"
	}
	if o.UIIP == "" {
		o.UIIP = o.IP
	}
	if o.FrontendPort == 0 {
		o.FrontendPort = 7233
	}
	for i, p := range []*int{&o.HistoryPort, &o.MatchingPort, &o.WorkerPort} {
		if *p == 0 {
			*p = o.FrontendPort + 1 + i
		}
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Retention == 0 {
		o.Retention = 7 * 24 * time.Hour
	}
}

// AddFlags adds the server's flags to f: outbox dev's and the built-in server's.
func (o *TemporalOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.IP, "ip", "127.0.0.1", "IP the Temporal services bind to")
	f.IntVar(&o.FrontendPort, "port", 7233, "Temporal frontend (gRPC) port")
	f.IntVar(&o.HistoryPort, "history-port", 0, "Temporal history service port (default: --port + 1; built-in server only)")
	f.IntVar(&o.MatchingPort, "matching-port", 0, "Temporal matching service port (default: --port + 2; built-in server only)")
	f.IntVar(&o.WorkerPort, "worker-port", 0, "Temporal worker service port (default: --port + 3; built-in server only)")
	f.IntVar(&o.FrontendHTTPPort, "http-port", 0, "Temporal frontend HTTP API port, which Nexus needs (default: a free port)")
	f.StringVar(&o.UIIP, "ui-ip", "127.0.0.1", "IP the Web UI binds to")
	f.IntVar(&o.UIPort, "ui-port", 8233, "Web UI port (0: no UI)")
	f.StringVar(&o.Namespace, "namespace", "default", "Temporal namespace")
	f.StringVar(&o.PostgresURL, strings.TrimPrefix(PostgresFlag, "--"), "", "keep the Temporal server's state in PostgreSQL (databases NAME and NAME_visibility of postgres://user@host:port/NAME, created when missing) instead of SQLite in --dir; built-in server only")
}

// serverArgs is the command line of the built-in server binary for o: DatabaseFile and
// LogFile are its --db-file and --log-file.
func (o TemporalOptions) serverArgs() []string {
	args := []string{
		"--ip", o.IP, "--port", strconv.Itoa(o.FrontendPort),
		"--history-port", strconv.Itoa(o.HistoryPort), "--matching-port", strconv.Itoa(o.MatchingPort),
		"--worker-port", strconv.Itoa(o.WorkerPort), "--http-port", strconv.Itoa(o.FrontendHTTPPort),
		"--ui-ip", o.UIIP, "--ui-port", strconv.Itoa(o.UIPort), "--namespace", o.Namespace,
		"--retention", o.Retention.String(),
	}
	if o.PostgresURL != "" {
		args = append(args, PostgresFlag, o.PostgresURL)
	}
	if o.DatabaseFile != "" {
		args = append(args, "--db-file", o.DatabaseFile)
	}
	if o.LogFile != "" {
		args = append(args, "--log-file", o.LogFile)
	}
	return args
}

// describePostgres names the two databases of --temporal-postgres URL, without its
// password: "databases temporal and temporal_visibility on 127.0.0.1:5432".
func describePostgres(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "PostgreSQL (an unparsable URL)"
	}
	name := cmp.Or(strings.TrimPrefix(u.Path, "/"), "temporal")
	return "PostgreSQL databases " + name + " and " + name + "_visibility on " + u.Host
}
