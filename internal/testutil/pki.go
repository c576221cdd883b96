package testutil

import (
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
	"testing"
	"time"
)

// ClientName is the common name of a PKI's client certificate.
const ClientName = "outbox-worker"

// PKI is a throwaway certificate authority with a server and a client certificate it
// signed, the files as PEM in the test's temporary folder.
type PKI struct {
	Pool     *x509.CertPool  // holds the CA
	Server   tls.Certificate // for the names NewPKI was given
	Client   tls.Certificate // ClientName, for client authentication
	CAFile   string          // the CA's certificate
	CertFile string          // the client's certificate
	KeyFile  string          // the client's key (PKCS #8)
	// OtherCAFile is the certificate of a CA that signed neither.
	OtherCAFile string
}

// NewPKI makes a PKI whose server certificate carries serverNames: host names, or IP
// addresses.
func NewPKI(t testing.TB, serverNames ...string) *PKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	newKey := func() *ecdsa.PrivateKey {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		check(err)
		return key
	}
	sign := func(tmpl, parent *x509.Certificate, pub, signer any) []byte {
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
		check(err)
		return der
	}
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
		der := sign(tmpl, tmpl, &key.PublicKey, key)
		cert, err := x509.ParseCertificate(der)
		check(err)
		return cert, key, der
	}
	ca, caKey, caDER := newCA("outbox test CA")
	_, _, otherDER := newCA("some other CA")
	leaf := func(serial int64, tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey) {
		key := newKey()
		tmpl.SerialNumber, tmpl.KeyUsage = big.NewInt(serial), x509.KeyUsageDigitalSignature
		return sign(tmpl, ca, &key.PublicKey, caKey), key
	}
	server := &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, name := range serverNames {
		if ip := net.ParseIP(name); ip != nil {
			server.IPAddresses = append(server.IPAddresses, ip)
		} else {
			server.DNSNames = append(server.DNSNames, name)
		}
	}
	if len(serverNames) > 0 {
		server.Subject.CommonName = serverNames[0]
	}
	serverDER, serverKey := leaf(2, server)
	clientDER, clientKey := leaf(3, &x509.Certificate{
		Subject: pkix.Name{CommonName: ClientName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	clientKeyDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	check(err)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		check(os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return path
	}
	p := &PKI{
		Pool:        x509.NewCertPool(),
		Server:      tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey},
		Client:      tls.Certificate{Certificate: [][]byte{clientDER}, PrivateKey: clientKey},
		CAFile:      write("ca.pem", "CERTIFICATE", caDER),
		CertFile:    write("client.pem", "CERTIFICATE", clientDER),
		KeyFile:     write("client-key.pem", "PRIVATE KEY", clientKeyDER),
		OtherCAFile: write("other-ca.pem", "CERTIFICATE", otherDER),
	}
	p.Pool.AddCert(ca)
	return p
}
