package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
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
)

// testPKI is a throwaway CA with a server certificate for 127.0.0.1 and localhost and a
// client certificate, as PEM files in a temporary directory.
type testPKI struct {
	caPool                    *x509.CertPool
	server, client            tls.Certificate
	caFile, certFile, keyFile string
	otherCAFile               string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		require.NoError(t, err)
		cert, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	ca, caKey, caPEM := newCA("outbox test CA")
	_, _, otherPEM := newCA("some other CA")
	leaf := func(serial int64, usage x509.ExtKeyUsage) (tls.Certificate, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "localhost"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		keyDER, err := x509.MarshalECPrivateKey(key)
		require.NoError(t, err)
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		require.NoError(t, err)
		return pair, certPEM, keyPEM
	}
	p := &testPKI{caPool: x509.NewCertPool()}
	p.caPool.AddCert(ca)
	p.server, _, _ = leaf(2, x509.ExtKeyUsageServerAuth)
	var certPEM, keyPEM []byte
	p.client, certPEM, keyPEM = leaf(3, x509.ExtKeyUsageClientAuth)
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	p.caFile, p.otherCAFile = write("ca.pem", caPEM), write("other-ca.pem", otherPEM)
	p.certFile, p.keyFile = write("client.pem", certPEM), write("client-key.pem", keyPEM)
	return p
}

// newTLSServer starts a Temporal server whose frontend requires TLS, and mutual TLS when
// mutual is true. The server's own clients of the frontend use the client certificate.
// It records the authorization headers the frontend receives.
func newTLSServer(t *testing.T, p *testPKI, mutual bool) (*temporaltest.TestServer, func() []string) {
	t.Helper()
	serverTLS := &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	if mutual {
		serverTLS.ClientAuth, serverTLS.ClientCAs = tls.RequireAndVerifyClientCert, p.caPool
	}
	internalClient := &tls.Config{RootCAs: p.caPool, Certificates: []tls.Certificate{p.client}, MinVersion: tls.VersionTLS12}
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
	cfg.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
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
	p := newTestPKI(t)

	t.Run("MutualTLS", func(t *testing.T) {
		t.Parallel()
		ts, auths := newTLSServer(t, p, true)
		const apiKey = "test-api-key-0123456789"

		c, err := dialFromEnv(t, ts, map[string]string{
			"TEMPORAL_TLS_CA": p.caFile, "TEMPORAL_TLS_CERT": p.certFile, "TEMPORAL_TLS_KEY": p.keyFile,
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
			_, err := dialFromEnv(t, ts, map[string]string{"TEMPORAL_TLS_CA": p.caFile})
			require.Error(t, err)
			t.Log(err)
			require.Contains(t, err.Error(), "connect to Temporal at "+ts.GetFrontendHostPort())
			require.Contains(t, err.Error(), "if the server requires mutual TLS, set temporal.tls.cert_file and key_file")
		})
	})

	t.Run("ServerTLS", func(t *testing.T) {
		t.Parallel()
		ts, _ := newTLSServer(t, p, false)

		c, err := dialFromEnv(t, ts, map[string]string{"TEMPORAL_TLS_CA": p.caFile})
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
			_, err := dialFromEnv(t, ts, map[string]string{"TEMPORAL_TLS_CA": p.otherCAFile})
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
