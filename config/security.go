package config

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/outbox-go/outbox/codec"
	"github.com/outbox-go/outbox/internal/tlsfiles"
)

// TLS secures the connection to the Temporal frontend. TLS is on when Enabled is true,
// or when Enabled is unset and any other field is set or an API key is configured; with
// none of them, the connection is plaintext.
type TLS struct {
	// Enabled turns TLS on or off explicitly. Unset: on when any field below or
	// temporal.api_key is set. False with an API key sends the key in plaintext (only for
	// a local server).
	Enabled *bool `yaml:"enabled"`
	// CAFile is a PEM file of the CAs that sign the server's certificate. Defaults to the
	// system's roots. Overridden by TEMPORAL_TLS_CA.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the PEM client certificate and key for mutual TLS; set both
	// or neither. Overridden by TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the server's certificate must carry, when it differs from
	// the address's host. Overridden by TEMPORAL_TLS_SERVER_NAME.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`

	// CAData, CertData and KeyData are PEM given inline in place of CAFile, CertFile and
	// KeyFile: from a temporal.toml profile (server_ca_cert_data, client_cert_data,
	// client_key_data) or TEMPORAL_TLS_SERVER_CA_CERT_DATA, TEMPORAL_TLS_CLIENT_CERT_DATA and
	// TEMPORAL_TLS_CLIENT_KEY_DATA. The YAML file names files, never holds the PEM.
	CAData   []byte `yaml:"-"`
	CertData []byte `yaml:"-"`
	KeyData  []byte `yaml:"-"`

	// skipVerifySet records that the file or the environment set InsecureSkipVerify,
	// false included, so a profile's disable_host_verification does not override it.
	skipVerifySet bool
}

// On reports whether TLS is on by the rules in [TLS]'s documentation; apiKey is
// temporal.api_key.
func (t TLS) On(apiKey string) bool {
	if t.Enabled != nil {
		return *t.Enabled
	}
	return t.anySet() || apiKey != ""
}

// anySet reports whether any setting besides Enabled is given.
func (t TLS) anySet() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify ||
		len(t.CAData) > 0 || len(t.CertData) > 0 || len(t.KeyData) > 0
}

// Disabled reports whether TLS was turned off explicitly.
func (t TLS) Disabled() bool { return t.Enabled != nil && !*t.Enabled }

// TLSConfig returns the client TLS configuration of the Temporal connection, or nil when
// TLS is off. It reads the CA, certificate and key files, or takes their PEM data; errors
// name the field and the file, never the contents.
func (t Temporal) TLSConfig() (*tls.Config, error) {
	if !t.TLS.On(t.APIKey) {
		return nil, nil
	}
	return tlsfiles.Load("temporal.tls", tlsfiles.Files{
		CAFile: t.TLS.CAFile, CertFile: t.TLS.CertFile, KeyFile: t.TLS.KeyFile,
		ServerName: t.TLS.ServerName, InsecureSkipVerify: t.TLS.InsecureSkipVerify,
		CAData: t.TLS.CAData, CertData: t.TLS.CertData, KeyData: t.TLS.KeyData,
	})
}

func (t Temporal) validateSecurity() error {
	if t.TLS.Disabled() {
		var set []string
		for _, f := range []struct{ name, value string }{
			{"ca_file", t.TLS.CAFile}, {"cert_file", t.TLS.CertFile}, {"key_file", t.TLS.KeyFile}, {"server_name", t.TLS.ServerName},
			{"ca_data", string(t.TLS.CAData)}, {"cert_data", string(t.TLS.CertData)}, {"key_data", string(t.TLS.KeyData)},
		} {
			if f.value != "" {
				set = append(set, f.name)
			}
		}
		if len(set) > 0 {
			return fmt.Errorf("temporal.tls.enabled: is false, but %s set (from the file, TEMPORAL_TLS_* or the temporal.toml profile); remove them or enable TLS", strings.Join(set, ", "))
		}
		return nil
	}
	_, err := t.TLSConfig()
	return err
}

// Codec configures payload encryption (see package [codec]). Every client of the
// namespace (worker, relay, codec server) needs the same keys.
type Codec struct {
	// Keys are the keys that decrypt; each has an ID recorded in the payloads it
	// encrypts. Keep a retired key here while histories encrypted with it are kept.
	Keys []CodecKey `yaml:"keys"`
	// Active is the ID of the key that encrypts. Defaults to the only key, or to the key
	// from OUTBOX_CODEC_KEY when that is set.
	Active string `yaml:"active"`

	envKey   string // OUTBOX_CODEC_KEY: base64 of 32 bytes
	envKeyID string // OUTBOX_CODEC_KEY_ID
}

// CodecKey is one codec key.
type CodecKey struct {
	// ID names the key; it must match ^[A-Za-z0-9._-]{1,64}$ and never be reused for
	// another key.
	ID string `yaml:"id"`
	// KeyFile holds the key: base64 of 32 random bytes (`openssl rand -base64 32`), or
	// the 32 bytes. Keep it readable by the outbox's user only.
	KeyFile string `yaml:"key_file"`
}

// Enabled reports whether a codec is configured.
func (c Codec) Enabled() bool { return len(c.Keys) > 0 || c.envKey != "" }

// New reads the keys and returns the codec, or nil when none is configured. Errors name
// the field and file, never the key material.
func (c Codec) New() (*codec.Codec, error) {
	if !c.Enabled() {
		return nil, nil
	}
	var (
		keys []codec.Key
		errs []error
		seen = map[string]bool{}
	)
	for i, k := range c.Keys {
		field := fmt.Sprintf("codec.keys[%d]", i)
		switch {
		case !codec.KeyIDPattern.MatchString(k.ID):
			errs = append(errs, fmt.Errorf("%s.id: must match %s, got %q", field, codec.KeyIDPattern, k.ID))
			continue
		case seen[k.ID]:
			errs = append(errs, fmt.Errorf("%s.id: %q is given twice", field, k.ID))
			continue
		case k.KeyFile == "":
			errs = append(errs, fmt.Errorf("%s.key_file: must be set (key %q)", field, k.ID))
			continue
		}
		seen[k.ID] = true
		key, err := codec.ReadKeyFile(k.ID, k.KeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.key_file: %w", field, err))
			continue
		}
		keys = append(keys, key)
	}
	active := c.Active
	if c.envKey != "" {
		id := cmp.Or(c.envKeyID, "env")
		key, err := codec.ParseKey(id, c.envKey)
		switch {
		case !codec.KeyIDPattern.MatchString(id):
			errs = append(errs, fmt.Errorf("OUTBOX_CODEC_KEY_ID: must match %s, got %q", codec.KeyIDPattern, id))
		case seen[id]:
			errs = append(errs, fmt.Errorf("OUTBOX_CODEC_KEY_ID: %q is also a key in codec.keys; give the key from OUTBOX_CODEC_KEY another ID", id))
		case err != nil:
			errs = append(errs, fmt.Errorf("OUTBOX_CODEC_KEY: %w", err))
		default:
			keys = append(keys, key)
			seen[id] = true
		}
		active = cmp.Or(active, id)
	}
	if active == "" && len(c.Keys) == 1 {
		active = c.Keys[0].ID
	}
	if len(errs) == 0 && !seen[active] {
		ids := make([]string, 0, len(keys))
		for _, k := range keys {
			ids = append(ids, k.ID)
		}
		errs = append(errs, fmt.Errorf("codec.active: must name the key that encrypts, one of %s; got %q", strings.Join(ids, ", "), active))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return codec.New(active, keys...)
}

func (c Codec) validate() error {
	if !c.Enabled() && c.Active != "" {
		// Nothing would be encrypted, though the file says which key encrypts.
		return fmt.Errorf("codec.active: names key %q, but no key is configured: list it under codec.keys (or set OUTBOX_CODEC_KEY)", c.Active)
	}
	_, err := c.New()
	return err
}
