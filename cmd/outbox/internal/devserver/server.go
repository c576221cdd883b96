package devserver

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	"go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
	"google.golang.org/protobuf/types/known/durationpb"

	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	"github.com/temporalio/ui-server/v2/server/server_options"

	"github.com/outbox-go/outbox/cmd/outbox/internal/dev"
	"github.com/outbox-go/outbox/internal/localserver"
	"github.com/outbox-go/outbox/workflows"
)

// options are the server's options, with their defaults applied.
type options dev.TemporalOptions

// TemporalServer is a Temporal server and Web UI running in this process (the
// temporalserver binary's).
type TemporalServer struct {
	server  temporal.Server
	ui      *uiserver.Server
	uiDone  chan struct{}
	address string
	uiURL   string
	scratch string // the folder of a throwaway state, removed at Stop
	// postgres describes the PostgreSQL databases of the state (no password); empty
	// when the state is in SQLite.
	postgres string
}

// Start starts the server (and the UI when asked) in this process and returns once both
// listen.
func Start(in dev.TemporalOptions) (*TemporalServer, error) {
	in.WithDefaults()
	o := options(in)
	if o.PostgresURL != "" {
		return o.startOnPostgres()
	}
	if err := o.checkPorts(); err != nil {
		return nil, err
	}
	scratch, err := o.placeState()
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started && scratch != "" {
			_ = os.RemoveAll(scratch)
		}
	}()
	sqlCfg, err := o.prepareState(scratch != "")
	if err != nil {
		return nil, err
	}
	frontend := net.JoinHostPort(o.IP, strconv.Itoa(o.FrontendPort))
	persistence := config.Persistence{
		DefaultStore:     sqliteplugin.PluginName,
		VisibilityStore:  sqliteplugin.PluginName,
		NumHistoryShards: 1,
		DataStores:       map[string]config.DataStore{sqliteplugin.PluginName: {SQL: sqlCfg}},
	}
	srv, err := o.newServer(persistence, o.logger(), frontend)
	if err != nil {
		return nil, fmt.Errorf("create Temporal server: %w", err)
	}
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start Temporal server: %w", err)
	}
	started = true
	t := &TemporalServer{server: srv, address: frontend, scratch: scratch}
	if o.UIPort != 0 {
		if err := t.startUI(o); err != nil {
			t.Stop()
			return nil, fmt.Errorf("start the Temporal UI: %w", err)
		}
	}
	return t, nil
}

// startOnPostgres is Start with the state in PostgreSQL (o.PostgresURL).
func (o options) startOnPostgres() (*TemporalServer, error) {
	stores, err := parsePostgresURL(o.PostgresURL)
	if err != nil {
		return nil, err
	}
	if err := o.checkPorts(); err != nil {
		return nil, err
	}
	logger := o.logger()
	if err := stores.prepare(logger); err != nil {
		return nil, err
	}
	frontend := net.JoinHostPort(o.IP, strconv.Itoa(o.FrontendPort))
	srv, err := o.newServer(stores.persistence(), logger, frontend)
	if err != nil {
		return nil, stores.scrub(fmt.Errorf("create Temporal server: %w", err))
	}
	if err := srv.Start(); err != nil {
		return nil, stores.scrub(fmt.Errorf("start Temporal server on %s: %w", stores.describe(), err))
	}
	t := &TemporalServer{server: srv, address: frontend, postgres: stores.describe()}
	if err := t.registerNamespace(o); err != nil {
		t.Stop()
		return nil, err
	}
	if o.UIPort != 0 {
		if err := t.startUI(o); err != nil {
			t.Stop()
			return nil, fmt.Errorf("start the Temporal UI: %w", err)
		}
	}
	return t, nil
}

// logger is the server's logger: warnings and errors, to o.LogFile or standard output.
func (o options) logger() log.Logger {
	return log.NewZapLogger(log.BuildZapLogger(log.Config{Level: "warn", Stdout: o.LogFile == "", OutputFile: o.LogFile}))
}

// clusterName names the one cluster of the in-process server.
const clusterName = "active"

// checkPorts makes sure every port the server and the UI listen on is free.
func (o options) checkPorts() error {
	ports := map[string]int{
		"--port": o.FrontendPort, "--history-port": o.HistoryPort,
		"--matching-port": o.MatchingPort, "--worker-port": o.WorkerPort,
	}
	if o.FrontendHTTPPort != 0 {
		ports["--http-port"] = o.FrontendHTTPPort
	}
	for flag, p := range ports {
		if err := dev.CheckPort(o.IP, p); err != nil {
			return fmt.Errorf("%s %d (a Temporal service port): %w", flag, p, err)
		}
	}
	if o.UIPort != 0 {
		if err := dev.CheckPort(o.UIIP, o.UIPort); err != nil {
			return fmt.Errorf("--ui-port %d (the Temporal UI): %w", o.UIPort, err)
		}
	}
	return nil
}

// placeState decides where the state lives: o.DatabaseFile, or (when it is empty) a
// throwaway file in a scratch folder it returns, on tmpfs when there is one.
func (o *options) placeState() (scratch string, err error) {
	if o.DatabaseFile != "" {
		return "", nil
	}
	dir, err := scratchDir()
	if err != nil {
		return "", fmt.Errorf("a folder for the Temporal state: %w", err)
	}
	o.DatabaseFile = filepath.Join(dir, "temporal.db")
	return dir, nil
}

// prepareState opens the state as a SQLite file in WAL mode (the plugin passes every
// attribute that is not a URI parameter as a pragma), creates the schema in a new file and
// the namespace. WAL with synchronous=normal survives a crash of this process (a power
// loss may lose the last transactions); a throwaway file needs no flush at all. (SQLite's
// own memory mode keeps a rollback journal in memory whose allocations cost the server
// half its CPU, hence a file even for throwaway state.)
func (o options) prepareState(throwaway bool) (*config.SQL, error) {
	synchronous := "normal"
	if throwaway {
		synchronous = "off"
	}
	sqlCfg := &config.SQL{PluginName: sqliteplugin.PluginName, DatabaseName: o.DatabaseFile, ConnectAttributes: map[string]string{
		"mode": "rwc", "journal_mode": "wal", "synchronous": synchronous,
	}}
	if _, err := os.Stat(o.DatabaseFile); errors.Is(err, os.ErrNotExist) {
		if err := sqlite.SetupSchema(sqlCfg); err != nil {
			return nil, fmt.Errorf("create Temporal schema in %s: %w", o.DatabaseFile, err)
		}
	}
	ns, err := sqlite.NewNamespaceConfig(clusterName, o.Namespace, false, searchAttributes())
	if err != nil {
		return nil, err
	}
	ns.Detail.Config.Retention = durationpb.New(o.Retention)
	if err := sqlite.CreateNamespaces(sqlCfg, ns); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", o.Namespace, err)
	}
	return sqlCfg, nil
}

// newServer builds the server: every service in this process on its own port, the state
// in persistence, archival off.
func (o options) newServer(persistence config.Persistence, logger log.Logger, frontend string) (temporal.Server, error) {
	service := func(port, httpPort int) config.Service {
		return config.Service{RPC: config.RPC{GRPCPort: port, HTTPPort: httpPort, BindOnIP: o.IP}}
	}
	httpPort := o.FrontendHTTPPort
	if httpPort == 0 {
		// As the Temporal CLI's development server does: the HTTP API on a free port, so
		// that Nexus, which the server dispatches to a handler's worker through it, works
		// without a flag.
		p, err := localserver.FreePort()
		if err != nil {
			return nil, fmt.Errorf("a port for the frontend's HTTP API: %w", err)
		}
		httpPort = p
	}
	cfg := &config.Config{
		Global: config.Global{
			Membership: config.Membership{MaxJoinDuration: 30 * time.Second, BroadcastAddress: o.IP},
		},
		Persistence: persistence,
		ClusterMetadata: &cluster.Config{
			EnableGlobalNamespace:    false,
			FailoverVersionIncrement: 10,
			MasterClusterName:        clusterName,
			CurrentClusterName:       clusterName,
			ClusterInformation: map[string]cluster.ClusterInformation{
				clusterName: {Enabled: true, InitialFailoverVersion: 1, RPCAddress: frontend},
			},
		},
		DCRedirectionPolicy: config.DCRedirectionPolicy{Policy: "noop"},
		Services: map[string]config.Service{
			"frontend": service(o.FrontendPort, httpPort),
			"history":  service(o.HistoryPort, 0),
			"matching": service(o.MatchingPort, 0),
			"worker":   service(o.WorkerPort, 0),
		},
		Archival: config.Archival{
			History:    config.HistoryArchival{State: "disabled"},
			Visibility: config.VisibilityArchival{State: "disabled"},
		},
		NamespaceDefaults: config.NamespaceDefaults{Archival: config.ArchivalNamespaceDefaults{
			History:    config.HistoryArchivalNamespaceDefaults{State: "disabled"},
			Visibility: config.VisibilityArchivalNamespaceDefaults{State: "disabled"},
		}},
		PublicClient: config.PublicClient{HostPort: frontend},
	}
	hosts := func(port int) static.Hosts { return static.SingleLocalHost(net.JoinHostPort(o.IP, strconv.Itoa(port))) }
	dyn := dynamicconfig.StaticClient{
		// One process, one shard: keep the server's footprint small.
		dynamicconfig.FrontendPersistenceMaxQPS.Key():           10000,
		dynamicconfig.HistoryPersistenceMaxQPS.Key():            10000,
		dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():  1,
		dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(): 1,
	}
	return temporal.NewServer(
		temporal.WithConfig(cfg),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(map[primitives.ServiceName]static.Hosts{
			primitives.FrontendService: hosts(o.FrontendPort),
			primitives.HistoryService:  hosts(o.HistoryPort),
			primitives.MatchingService: hosts(o.MatchingPort),
			primitives.WorkerService:   hosts(o.WorkerPort),
		}),
		temporal.WithLogger(logger),
		temporal.WithDynamicConfigClient(dyn),
	)
}

// startUI serves the Temporal Web UI on o.UIIP:o.UIPort and waits until it listens.
func (t *TemporalServer) startUI(o options) error {
	t.ui = uiserver.NewServer(server_options.WithConfigProvider(&uiconfig.Config{
		Host:                o.UIIP,
		Port:                o.UIPort,
		TemporalGRPCAddress: t.address,
		EnableUI:            true,
		DefaultNamespace:    o.Namespace,
		HideLogs:            true,
		Distribution:        "outbox-dev",
		CORS:                uiconfig.CORS{CookieInsecure: true},
	}))
	t.uiDone = make(chan struct{})
	go func() {
		defer close(t.uiDone)
		_ = t.ui.Start()
	}()
	addr := net.JoinHostPort(o.UIIP, strconv.Itoa(o.UIPort))
	t.uiURL = "http://" + addr
	return waitListening(addr, 10*time.Second)
}

// Address returns the frontend's host:port.
func (t *TemporalServer) Address() string { return t.address }

// Postgres describes where the state is when it is in PostgreSQL (without the
// password), and is empty when it is in SQLite.
func (t *TemporalServer) Postgres() string { return t.postgres }

// Stop stops the UI and the server.
func (t *TemporalServer) Stop() {
	if t.ui != nil {
		t.ui.Stop()
		<-t.uiDone
	}
	_ = t.server.Stop()
	if t.scratch != "" {
		_ = os.RemoveAll(t.scratch)
	}
}

// scratchDir makes a folder for a throwaway state: on tmpfs when the machine has one.
func scratchDir() (string, error) {
	if dir, err := os.MkdirTemp("/dev/shm", "outbox-temporal-"); err == nil {
		return dir, nil
	}
	return os.MkdirTemp("", "outbox-temporal-")
}

func searchAttributes() map[string]enumspb.IndexedValueType {
	out := map[string]enumspb.IndexedValueType{}
	for _, name := range workflows.SearchAttributeNames {
		out[name] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
	}
	return out
}

func waitListening(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s after %s: %w", addr, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
