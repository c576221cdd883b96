package activities

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testPKI is a CA with a server certificate for receiverName and a client certificate for
// clientName, all signed by the CA, as PEM files in a temporary directory.
type testPKI struct {
	caFile, certFile, keyFile string // the CA, and the client's certificate and key
	pool                      *x509.CertPool
	server                    tls.Certificate
}

const (
	receiverName = "receiver.outbox.test"
	clientName   = "outbox-worker"
)

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	// leaf returns a certificate signed by the CA, and its key.
	leaf := func(serial int64, tmpl *x509.Certificate) (certDER []byte, key *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		certDER, err = x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		return certDER, key
	}
	// The server's certificate names it, not its address: the sink reaches it by
	// 127.0.0.1 and needs server_name.
	serverDER, serverKey := leaf(2, &x509.Certificate{
		Subject: pkix.Name{CommonName: receiverName}, DNSNames: []string{receiverName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	clientDER, clientKey := leaf(3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: clientName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})

	writePEM := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return path
	}
	clientKeyDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	require.NoError(t, err)
	p := &testPKI{
		caFile:   writePEM("ca.pem", "CERTIFICATE", caDER),
		certFile: writePEM("client.pem", "CERTIFICATE", clientDER),
		keyFile:  writePEM("client-key.pem", "PRIVATE KEY", clientKeyDER),
		pool:     x509.NewCertPool(),
		server:   tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey},
	}
	p.pool.AddCert(ca)
	return p
}

// mtlsServer starts a TLS server that requires a client certificate signed by the CA, and
// counts the requests it served.
func mtlsServer(t *testing.T, p *testPKI) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var served atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != clientName {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		served.Add(1)
		if r.Method == http.MethodGet { // CheckURL
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.pool,
		MinVersion:   tls.VersionTLS12,
	}
	// The failed handshakes below are expected; keep them out of the test output.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &served
}

func TestHTTPSinkTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newTestPKI(t)
	srv, served := mtlsServer(t, p)
	full := TLSFiles{CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile, ServerName: receiverName}
	sink := func(t *testing.T, files TLSFiles) *HTTPSink {
		t.Helper()
		s, err := NewHTTPSink(SinkConfig{URL: srv.URL + "/events", CheckURL: srv.URL + "/events/{message_id}", TLS: files})
		require.NoError(t, err)
		return s
	}
	// sendFails sends through a sink of files, which the server must not serve.
	sendFails := func(t *testing.T, files TLSFiles) error {
		t.Helper()
		before := served.Load()
		err := sink(t, files).Send(ctx, testDelivery())
		require.Error(t, err)
		require.Equal(t, before, served.Load(), "the server served a request it should have refused")
		return err
	}

	t.Run("MutualTLSDelivers", func(t *testing.T) {
		s := sink(t, full)
		require.NoError(t, s.Send(ctx, testDelivery()))
		processed, err := s.CheckProcessed(ctx, testDelivery())
		require.NoError(t, err)
		require.True(t, processed)

		// The sink has a transport of its own; the default one is left as it was.
		tr, ok := s.Client.Transport.(*http.Transport)
		require.True(t, ok)
		require.NotSame(t, http.DefaultTransport, tr)
		require.Equal(t, receiverName, tr.TLSClientConfig.ServerName)
		if def := http.DefaultTransport.(*http.Transport).TLSClientConfig; def != nil {
			require.Empty(t, def.ServerName)
			require.Nil(t, def.RootCAs)
		}
	})

	t.Run("WithoutClientCertificate", func(t *testing.T) {
		// Under TLS 1.3 the server refuses the handshake after the client sent its request,
		// so the failure is ambiguous rather than retryable; either is retried.
		err := sendFails(t, TLSFiles{CAFile: p.caFile, ServerName: receiverName})
		require.False(t, IsPermanent(err), "a refused handshake is worth retrying: %v", err)
	})

	t.Run("SystemRoots", func(t *testing.T) {
		// Without ca_file the sink trusts the system's roots, which do not hold the test CA.
		err := sendFails(t, TLSFiles{CertFile: p.certFile, KeyFile: p.keyFile, ServerName: receiverName})
		var verr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &verr)
		var uerr x509.UnknownAuthorityError
		require.ErrorAs(t, err, &uerr)
		_, retryable := IsRetryable(err)
		require.True(t, retryable, "no request was sent: %v", err)
	})

	t.Run("ServerNameChecked", func(t *testing.T) {
		// Without server_name the sink expects the certificate to name 127.0.0.1.
		files := full
		files.ServerName = ""
		err := sendFails(t, files)
		var herr x509.HostnameError
		require.ErrorAs(t, err, &herr)
	})

	t.Run("NoTLSSettings", func(t *testing.T) {
		// No TLS settings: the default transport, which does not trust the test CA.
		s := sink(t, TLSFiles{})
		require.Nil(t, s.Client.Transport)
		err := s.Send(ctx, testDelivery())
		var verr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &verr)
	})

	t.Run("LoadErrors", func(t *testing.T) {
		_, err := NewHTTPSink(SinkConfig{URL: srv.URL, TLS: TLSFiles{CAFile: filepath.Join(t.TempDir(), "missing.pem")}})
		require.ErrorContains(t, err, "tls.ca_file")
		require.ErrorContains(t, err, "missing.pem")
		require.True(t, errors.Is(err, os.ErrNotExist), "%v", err)

		_, err = NewHTTPSink(SinkConfig{URL: srv.URL, TLS: TLSFiles{CAFile: p.keyFile}})
		require.ErrorContains(t, err, "tls.ca_file: no PEM certificate")

		_, err = NewHTTPSink(SinkConfig{URL: srv.URL, TLS: TLSFiles{CAFile: p.caFile, CertFile: p.certFile}})
		require.ErrorContains(t, err, "tls.key_file")
	})
}
