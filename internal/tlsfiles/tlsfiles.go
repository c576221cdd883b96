// Package tlsfiles builds a client TLS configuration from PEM files (or PEM data given
// inline), for the Temporal connection and the sinks alike.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Files are the PEM files and names of a client TLS configuration. Each of the CA, the
// client certificate and its key comes from its file or from its data (PEM given inline),
// not both.
type Files struct {
	CAFile, CertFile, KeyFile, ServerName string
	InsecureSkipVerify                    bool

	CAData, CertData, KeyData []byte
}

// Load reads the files and returns the configuration. Errors name the field under prefix
// (prefix + ".ca_file", prefix + ".ca_data") and the file, never the file's contents or
// the data.
func Load(prefix string, f Files) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         f.ServerName,
		InsecureSkipVerify: f.InsecureSkipVerify, //nolint:gosec // opted into in the config, documented as tests only
	}
	var errs []error
	for _, p := range []struct {
		name       string
		file, data bool
	}{{"ca", f.CAFile != "", len(f.CAData) > 0}, {"cert", f.CertFile != "", len(f.CertData) > 0}, {"key", f.KeyFile != "", len(f.KeyData) > 0}} {
		if p.file && p.data {
			errs = append(errs, fmt.Errorf("%s.%s_file and %s_data: both are set; set one", prefix, p.name, p.name))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	switch {
	case f.CAFile != "":
		pem, err := os.ReadFile(f.CAFile)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s.ca_file: %w", prefix, err))
		default:
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("%s.ca_file: no PEM certificate in %s", prefix, f.CAFile))
			}
			cfg.RootCAs = pool
		}
	case len(f.CAData) > 0:
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(f.CAData) {
			errs = append(errs, fmt.Errorf("%s.ca_data: no PEM certificate in the data", prefix))
		}
		cfg.RootCAs = pool
	}
	certSet, keySet := f.CertFile != "" || len(f.CertData) > 0, f.KeyFile != "" || len(f.KeyData) > 0
	switch {
	case certSet && keySet:
		cert, err := loadKeyPair(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.%s and %s: load the client certificate %s with key %s: %s",
				prefix, pick(f.CertFile, "cert_file", "cert_data"), pick(f.KeyFile, "key_file", "key_data"),
				pick(f.CertFile, f.CertFile, "(inline data)"), pick(f.KeyFile, f.KeyFile, "(inline data)"), keyPairError(err)))
		} else {
			cfg.Certificates = []tls.Certificate{cert}
		}
	case certSet:
		errs = append(errs, fmt.Errorf("%s.key_file: must be set with %s (%s), for mutual TLS", prefix,
			pick(f.CertFile, "cert_file", "cert_data"), pick(f.CertFile, f.CertFile, "inline data")))
	case keySet:
		errs = append(errs, fmt.Errorf("%s.cert_file: must be set with %s (%s), for mutual TLS", prefix,
			pick(f.KeyFile, "key_file", "key_data"), pick(f.KeyFile, f.KeyFile, "inline data")))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// pick returns ifFile when file is set, else ifData.
func pick(file, ifFile, ifData string) string {
	if file != "" {
		return ifFile
	}
	return ifData
}

// loadKeyPair reads the client certificate and key, each from its file or its data.
func loadKeyPair(f Files) (tls.Certificate, error) {
	certPEM, keyPEM := f.CertData, f.KeyData
	var err error
	if f.CertFile != "" {
		if certPEM, err = os.ReadFile(f.CertFile); err != nil {
			return tls.Certificate{}, err
		}
	}
	if f.KeyFile != "" {
		if keyPEM, err = os.ReadFile(f.KeyFile); err != nil {
			return tls.Certificate{}, err
		}
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// keyPairError describes a failure of tls.LoadX509KeyPair. Its errors are fixed texts or
// *os.PathError, neither of which quotes the files' contents; anything else is replaced
// by a fixed text.
func keyPairError(err error) string {
	var pathErr *os.PathError
	if errors.As(err, &pathErr) || strings.HasPrefix(err.Error(), "tls: ") {
		return err.Error()
	}
	return "not a PEM certificate and matching private key"
}
