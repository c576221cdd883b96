package httpsink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/sinks"
)

// receiverName is the only name of the server's certificate: the sink reaches the server
// by 127.0.0.1 and needs server_name.
const receiverName = "receiver.outbox.test"

// mtlsServer starts a TLS server that requires a client certificate signed by the CA, and
// counts the requests it served.
func mtlsServer(t *testing.T, p *testutil.PKI) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var served atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != testutil.ClientName {
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
		Certificates: []tls.Certificate{p.Server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.Pool,
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
	p := testutil.NewPKI(t, receiverName)
	srv, served := mtlsServer(t, p)
	full := sinks.TLSFiles{CAFile: p.CAFile, CertFile: p.CertFile, KeyFile: p.KeyFile, ServerName: receiverName}
	sink := func(t *testing.T, files sinks.TLSFiles) *Sink {
		t.Helper()
		s, err := New(Config{URL: srv.URL + "/events", CheckURL: srv.URL + "/events/{message_id}", TLS: files})
		require.NoError(t, err)
		return s
	}
	// sendFails sends through a sink of files, which the server must not serve.
	sendFails := func(t *testing.T, files sinks.TLSFiles) error {
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
		err := sendFails(t, sinks.TLSFiles{CAFile: p.CAFile, ServerName: receiverName})
		require.False(t, delivery.IsPermanent(err), "a refused handshake is worth retrying: %v", err)
	})

	t.Run("SystemRoots", func(t *testing.T) {
		// Without ca_file the sink trusts the system's roots, which do not hold the test CA.
		err := sendFails(t, sinks.TLSFiles{CertFile: p.CertFile, KeyFile: p.KeyFile, ServerName: receiverName})
		var verr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &verr)
		var uerr x509.UnknownAuthorityError
		require.ErrorAs(t, err, &uerr)
		_, retryable := delivery.IsRetryable(err)
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
		s := sink(t, sinks.TLSFiles{})
		require.Nil(t, s.Client.Transport)
		err := s.Send(ctx, testDelivery())
		var verr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &verr)
	})

	t.Run("LoadErrors", func(t *testing.T) {
		_, err := New(Config{URL: srv.URL, TLS: sinks.TLSFiles{CAFile: filepath.Join(t.TempDir(), "missing.pem")}})
		require.ErrorContains(t, err, "tls.ca_file")
		require.ErrorContains(t, err, "missing.pem")
		require.True(t, errors.Is(err, os.ErrNotExist), "%v", err)

		_, err = New(Config{URL: srv.URL, TLS: sinks.TLSFiles{CAFile: p.KeyFile}})
		require.ErrorContains(t, err, "tls.ca_file: no PEM certificate")

		_, err = New(Config{URL: srv.URL, TLS: sinks.TLSFiles{CAFile: p.CAFile, CertFile: p.CertFile}})
		require.ErrorContains(t, err, "tls.key_file")
	})
}
