package sinks

import (
	"crypto/tls"

	"github.com/outbox-go/outbox/internal/tlsfiles"
)

// TLSFiles secure a sink's connection: the CAs that sign the server's certificate
// (default: the system's roots) and a client certificate for mutual TLS, as PEM files.
type TLSFiles struct {
	// Enabled turns TLS on with the system's roots when nothing else is set: for kafka,
	// whose brokers have no scheme (nats and rabbitmq take TLS from tls:// and amqps://
	// too, http from https://).
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// IsZero reports whether no setting is given.
func (f TLSFiles) IsZero() bool { return f == TLSFiles{} }

// Load reads the files and returns the client TLS configuration. Errors name the setting
// under "tls." and the file, never the file's contents.
func (f TLSFiles) Load() (*tls.Config, error) {
	return tlsfiles.Load("tls", tlsfiles.Files{
		CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile,
		ServerName: f.ServerName, InsecureSkipVerify: f.InsecureSkipVerify,
	})
}
