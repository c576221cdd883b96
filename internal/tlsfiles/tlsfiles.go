// Package tlsfiles builds a client TLS configuration from PEM files, for the Temporal
// connection and the sinks alike.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Files are the PEM files and names of a client TLS configuration.
type Files struct {
	CAFile, CertFile, KeyFile, ServerName string
	InsecureSkipVerify                    bool
}

// Load reads the files and returns the configuration. Errors name the field under prefix
// (prefix + ".ca_file") and the file, never the file's contents.
func Load(prefix string, f Files) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         f.ServerName,
		InsecureSkipVerify: f.InsecureSkipVerify, //nolint:gosec // opted into in the config, documented as tests only
	}
	var errs []error
	if f.CAFile != "" {
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
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.cert_file and key_file: load the client certificate %s with key %s: %s",
				prefix, f.CertFile, f.KeyFile, keyPairError(err)))
		} else {
			cfg.Certificates = []tls.Certificate{cert}
		}
	case f.CertFile != "":
		errs = append(errs, fmt.Errorf("%s.key_file: must be set with cert_file (%s), for mutual TLS", prefix, f.CertFile))
	case f.KeyFile != "":
		errs = append(errs, fmt.Errorf("%s.cert_file: must be set with key_file (%s), for mutual TLS", prefix, f.KeyFile))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
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
