package e2e

import (
	"context"
	"crypto/tls"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/common/rpc/encryption"
	"go.temporal.io/server/temporal"
	"go.temporal.io/server/temporaltest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/outbox-go/outbox/app"
	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testutil"
)

// newTLSServer starts a Temporal server whose frontend requires TLS, and mutual TLS when
// mutual is true. The server's own clients of the frontend use the client certificate.
// It records the authorization headers the frontend receives.
func newTLSServer(t *testing.T, p *testutil.PKI, mutual bool) (*temporaltest.TestServer, func() []string) {
	t.Helper()
	serverTLS := &tls.Config{Certificates: []tls.Certificate{p.Server}, MinVersion: tls.VersionTLS12}
	if mutual {
		serverTLS.ClientAuth, serverTLS.ClientCAs = tls.RequireAndVerifyClientCert, p.Pool
	}
	internalClient := &tls.Config{RootCAs: p.Pool, Certificates: []tls.Certificate{p.Client}, MinVersion: tls.VersionTLS12}
	var (
		mu    sync.Mutex
		auths []string
	)
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		auths = append(auths, md.Get("authorization")...)
		mu.Unlock()
		return handler(ctx, req)
	}
	ts := temporaltest.NewServer(temporaltest.WithT(t),
		temporaltest.WithBaseClientOptions(client.Options{ConnectionOptions: client.ConnectionOptions{TLS: internalClient}}),
		temporaltest.WithBaseServerOptions(
			temporal.WithTLSConfigFactory(&encryption.FixedTLSConfigProvider{FrontendServerConfig: serverTLS, FrontendClientConfig: internalClient}),
			temporal.WithChainedFrontendGrpcInterceptors(record),
		))
	return ts, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(auths) }
}

// dialFromEnv dials the server the way `outbox worker` does, with the config taken from
// the environment.
func dialFromEnv(t *testing.T, ts *temporaltest.TestServer, env map[string]string) (client.Client, error) {
	t.Helper()
	cfg := &config.Config{Temporal: config.Temporal{Address: ts.GetFrontendHostPort(), Namespace: ts.GetDefaultNamespace()}}
	require.NoError(t, cfg.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))
	c := cfg.WithDefaults()
	require.NoError(t, c.Validate())
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cl, err := app.Dial(ctx, c)
	if err == nil {
		t.Cleanup(cl.Close)
	}
	return cl, err
}

func echoWorkflow(_ workflow.Context, s string) (string, error) { return "echo: " + s, nil }

func TestTLS(t *testing.T) {
	t.Parallel()
	p := testutil.NewPKI(t, "localhost", "127.0.0.1")

	t.Run("MutualTLS", func(t *testing.T) {
		t.Parallel()
		ts, auths := newTLSServer(t, p, true)
		const apiKey = "test-api-key-0123456789"

		c, err := dialFromEnv(t, ts, map[string]string{
			"TEMPORAL_TLS_CA": p.CAFile, "TEMPORAL_TLS_CERT": p.CertFile, "TEMPORAL_TLS_KEY": p.KeyFile,
			"TEMPORAL_TLS_SERVER_NAME": "localhost", "TEMPORAL_API_KEY": apiKey,
		})
		require.NoError(t, err)
		ctx := context.Background()
		_, err = c.CheckHealth(ctx, &client.CheckHealthRequest{})
		require.NoError(t, err)
		require.Contains(t, auths(), "Bearer "+apiKey, "the API key is sent as a bearer token")

		// A workflow round trip over the TLS connection.
		w := sdkworker.New(c, "tls-echo", sdkworker.Options{})
		w.RegisterWorkflow(echoWorkflow)
		require.NoError(t, w.Start())
		t.Cleanup(w.Stop)
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: "tls-echo"}, echoWorkflow, "over TLS")
		require.NoError(t, err)
		var got string
		require.NoError(t, run.Get(ctx, &got))
		require.Equal(t, "echo: over TLS", got)

		t.Run("WithoutClientCertificateFails", func(t *testing.T) {
			_, err := dialFromEnv(t, ts, map[string]string{"TEMPORAL_TLS_CA": p.CAFile})
			require.Error(t, err)
			t.Log(err)
			require.Contains(t, err.Error(), "connect to Temporal at "+ts.GetFrontendHostPort())
			require.Contains(t, err.Error(), "if the server requires mutual TLS, set temporal.tls.cert_file and key_file")
		})
	})

	t.Run("ServerTLS", func(t *testing.T) {
		t.Parallel()
		ts, _ := newTLSServer(t, p, false)

		c, err := dialFromEnv(t, ts, map[string]string{"TEMPORAL_TLS_CA": p.CAFile})
		require.NoError(t, err)
		_, err = c.CheckHealth(context.Background(), &client.CheckHealthRequest{})
		require.NoError(t, err)

		t.Run("WithoutTheCAFails", func(t *testing.T) {
			// The system's roots do not know the test CA.
			_, err := dialFromEnv(t, ts, map[string]string{"TEMPORAL_TLS_SERVER_NAME": "localhost"})
			require.Error(t, err)
			t.Log(err)
			require.Contains(t, err.Error(), "x509: certificate signed by unknown authority")
			require.Contains(t, err.Error(), "check temporal.tls.ca_file (TEMPORAL_TLS_CA)")
		})

		t.Run("WithAnotherCAFails", func(t *testing.T) {
			_, err := dialFromEnv(t, ts, map[string]string{"TEMPORAL_TLS_CA": p.OtherCAFile})
			require.Error(t, err)
			t.Log(err)
			require.Contains(t, err.Error(), "x509: certificate signed by unknown authority")
		})

		t.Run("PlaintextFails", func(t *testing.T) {
			_, err := dialFromEnv(t, ts, nil)
			require.Error(t, err)
			t.Log(err)
			require.Contains(t, err.Error(), "connect to Temporal at "+ts.GetFrontendHostPort())
			require.Contains(t, err.Error(), "if the server requires TLS, set temporal.tls")
		})
	})
}
