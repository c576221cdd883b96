package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"go.temporal.io/sdk/contrib/envconfig"

	"github.com/outbox-go/outbox/internal/redact"
)

// The Temporal CLI's environment configuration: the TEMPORAL_* variables and the profiles
// of temporal.toml, as the SDK's envconfig package defines them, reach the temporal
// section with the outbox's precedence (see [Config.ApplyEnv]).

// temporalEnvVar is a variable of the Temporal CLI that sets a string of the temporal
// section.
type temporalEnvVar struct {
	names []string // aliases, all setting the same key
	set   func(t *Temporal, v string)
}

// temporalEnvVars are the string variables; TEMPORAL_TLS and
// TEMPORAL_TLS_DISABLE_HOST_VERIFICATION, booleans, are read apart. A path and the data of
// the same PEM (CA, certificate, key) replace each other.
var temporalEnvVars = []temporalEnvVar{
	{[]string{"TEMPORAL_ADDRESS"}, func(t *Temporal, v string) { t.Address = v }},
	{[]string{"TEMPORAL_NAMESPACE"}, func(t *Temporal, v string) { t.Namespace = v }},
	{[]string{"TEMPORAL_API_KEY"}, func(t *Temporal, v string) { t.APIKey = v }},
	{[]string{"TEMPORAL_CLIENT_AUTHORITY"}, func(t *Temporal, v string) { t.Authority = v }},
	{[]string{"TEMPORAL_TLS_CA", "TEMPORAL_TLS_SERVER_CA_CERT_PATH"}, func(t *Temporal, v string) { t.TLS.CAFile, t.TLS.CAData = v, nil }},
	{[]string{"TEMPORAL_TLS_SERVER_CA_CERT_DATA"}, func(t *Temporal, v string) { t.TLS.CAFile, t.TLS.CAData = "", []byte(v) }},
	{[]string{"TEMPORAL_TLS_CERT", "TEMPORAL_TLS_CLIENT_CERT_PATH"}, func(t *Temporal, v string) { t.TLS.CertFile, t.TLS.CertData = v, nil }},
	{[]string{"TEMPORAL_TLS_CLIENT_CERT_DATA"}, func(t *Temporal, v string) { t.TLS.CertFile, t.TLS.CertData = "", []byte(v) }},
	{[]string{"TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CLIENT_KEY_PATH"}, func(t *Temporal, v string) { t.TLS.KeyFile, t.TLS.KeyData = v, nil }},
	{[]string{"TEMPORAL_TLS_CLIENT_KEY_DATA"}, func(t *Temporal, v string) { t.TLS.KeyFile, t.TLS.KeyData = "", []byte(v) }},
	{[]string{"TEMPORAL_TLS_SERVER_NAME"}, func(t *Temporal, v string) { t.TLS.ServerName = v }},
}

// applyEnv sets the temporal section from the Temporal CLI's variables. Two aliases set to
// different values, a PEM given both as a path and as data, a boolean that is not one, and
// a remote codec are errors naming the variables.
func (t *Temporal) applyEnv(lookup func(string) (string, bool)) error {
	get := func(name string) string { v, _ := lookup(name); return v }
	var errs []error
	for _, e := range temporalEnvVars {
		var from, value string
		for _, name := range e.names {
			v := get(name)
			switch {
			case v == "":
			case from == "":
				from, value = name, v
			case v != value:
				errs = append(errs, fmt.Errorf("%s and %s: both are set, to different values; set one", from, name))
			}
		}
		if from != "" {
			e.set(t, value)
		}
	}
	for _, pem := range []struct{ path, alias, data string }{
		{"TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_CA", "TEMPORAL_TLS_SERVER_CA_CERT_DATA"},
		{"TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CERT", "TEMPORAL_TLS_CLIENT_CERT_DATA"},
		{"TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CLIENT_KEY_DATA"},
	} {
		if get(pem.data) == "" {
			continue
		}
		for _, path := range []string{pem.alias, pem.path} {
			if get(path) != "" {
				errs = append(errs, fmt.Errorf("%s and %s: both are set; set the file or the PEM data, not both", path, pem.data))
				break
			}
		}
	}
	for _, b := range []struct {
		name string
		set  func(bool)
	}{
		{"TEMPORAL_TLS", func(on bool) { t.TLS.Enabled = &on }},
		{"TEMPORAL_TLS_DISABLE_HOST_VERIFICATION", func(skip bool) { t.TLS.InsecureSkipVerify, t.TLS.skipVerifySet = skip, true }},
	} {
		v := get(b.name)
		switch strings.ToLower(v) {
		case "":
		case "true", "1":
			b.set(true)
		case "false", "0":
			b.set(false)
		default:
			errs = append(errs, fmt.Errorf("%s: must be true, false, 1 or 0, got %q", b.name, v))
		}
	}
	if get(EnvPrefix+"TEMPORAL_TLS_INSECURE_SKIP_VERIFY") != "" {
		t.TLS.skipVerifySet = true // applyPathEnv has set it
	}
	if v := get("TEMPORAL_CODEC_ENDPOINT"); v != "" {
		errs = append(errs, remoteCodecError("TEMPORAL_CODEC_ENDPOINT", v, "unset it for the outbox"))
	}
	return errors.Join(errs...)
}

// remoteCodecError says that a remote codec is not supported, and what to do instead. The
// endpoint is shown as scheme and host only.
func remoteCodecError(field, endpoint, remedy string) error {
	return fmt.Errorf("%s: a remote codec (%s) is not supported: the outbox's worker would call it for every payload, "+
		"replays included. Encrypt with the outbox's codec settings (codec.keys, or OUTBOX_CODEC_KEY), serve them to the "+
		"UI and the CLI with outbox codec-server, and %s", field, redact.URL(endpoint), remedy)
}

// applyProfile fills the keys of the temporal section that the file and the environment
// left unset from the profile of the Temporal CLI's config file. Without a file, or
// without the default profile in it, nothing changes; a profile named explicitly must
// exist.
func (t *Temporal) applyProfile(lookup func(string) (string, bool)) error {
	name, source := t.Profile, "temporal.profile"
	if v, _ := lookup("TEMPORAL_PROFILE"); v != "" {
		name, source = v, "TEMPORAL_PROFILE"
	}
	path, pathSource := "", "TEMPORAL_CONFIG_FILE"
	if v, _ := lookup("TEMPORAL_CONFIG_FILE"); v != "" {
		path = v
	} else {
		path, pathSource = DefaultTemporalConfigFile(lookup), "the Temporal CLI's default path"
	}
	what := func() string {
		if name == "" {
			return fmt.Sprintf("temporal profile %q of %s (%s)", envconfig.DefaultConfigFileProfile, path, pathSource)
		}
		return fmt.Sprintf("temporal profile %q (%s) of %s (%s)", name, source, path, pathSource)
	}
	if path == "" {
		if name != "" {
			return fmt.Errorf("temporal profile %q (%s): no temporal.toml to find it in: TEMPORAL_CONFIG_FILE is not set and there is no user config directory (HOME); set TEMPORAL_CONFIG_FILE", name, source)
		}
		return nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if name != "" {
			return fmt.Errorf("%s: the file does not exist; set TEMPORAL_CONFIG_FILE to the temporal.toml that has the profile, or name another profile", what())
		}
		return nil
	}
	env := envLookup(lookup)
	prof, err := envconfig.LoadClientConfigProfile(envconfig.LoadClientConfigProfileOptions{
		ConfigFilePath:    path,
		ConfigFileProfile: name,
		// The environment is applied by ApplyEnv, above the file; the profile is the
		// lowest layer.
		DisableEnv: true,
		EnvLookup:  env,
	})
	if err != nil {
		if all, lerr := envconfig.LoadClientConfig(envconfig.LoadClientConfigOptions{ConfigFilePath: path, EnvLookup: env}); lerr == nil && all.Profiles[name] == nil {
			names := slices.Sorted(maps.Keys(all.Profiles))
			return fmt.Errorf("%s: the file has no such profile; it has %s", what(), cmp.Or(strings.Join(names, ", "), "none"))
		}
		return fmt.Errorf("%s: %w", what(), err)
	}
	if prof.Codec != nil && prof.Codec.Endpoint != "" {
		return remoteCodecError(what()+": codec.endpoint", prof.Codec.Endpoint, "name a profile without a codec for the outbox (TEMPORAL_PROFILE or temporal.profile)")
	}
	if err := t.fillFromProfile(prof); err != nil {
		return fmt.Errorf("%s: %w", what(), err)
	}
	return nil
}

// fillFromProfile sets the keys that are unset from the profile. The CA, and the client
// certificate with its key, are taken as a whole: a path or data given above the profile
// keeps the profile's out. The profile's tls.disabled turns TLS off only when nothing
// above it sets a TLS key.
func (t *Temporal) fillFromProfile(p envconfig.ClientConfigProfile) error {
	t.Address = cmp.Or(t.Address, p.Address)
	t.Namespace = cmp.Or(t.Namespace, p.Namespace)
	t.APIKey = cmp.Or(t.APIKey, p.APIKey)
	t.Authority = cmp.Or(t.Authority, p.Authority)
	have := t.Headers() // the names above the profile, normalized
	for k, v := range p.GRPCMeta {
		k = envconfig.NormalizeGRPCMetaKey(k)
		if _, ok := have[k]; !ok {
			if t.GRPCMeta == nil {
				t.GRPCMeta = map[string]string{}
			}
			t.GRPCMeta[k] = v
		}
	}
	pt := p.TLS
	if pt == nil {
		return nil
	}
	var errs []error
	for _, f := range []struct {
		name string
		both bool
	}{
		{"server_ca_cert_path and server_ca_cert_data", pt.ServerCACertPath != "" && len(pt.ServerCACertData) > 0},
		{"client_cert_path and client_cert_data", pt.ClientCertPath != "" && len(pt.ClientCertData) > 0},
		{"client_key_path and client_key_data", pt.ClientKeyPath != "" && len(pt.ClientKeyData) > 0},
	} {
		if f.both {
			errs = append(errs, fmt.Errorf("tls.%s: both are set; set the path or the data, not both", f.name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	above := t.TLS.anySet()
	if t.TLS.CAFile == "" && len(t.TLS.CAData) == 0 {
		t.TLS.CAFile, t.TLS.CAData = pt.ServerCACertPath, pt.ServerCACertData
	}
	if t.TLS.CertFile == "" && len(t.TLS.CertData) == 0 && t.TLS.KeyFile == "" && len(t.TLS.KeyData) == 0 {
		t.TLS.CertFile, t.TLS.CertData = pt.ClientCertPath, pt.ClientCertData
		t.TLS.KeyFile, t.TLS.KeyData = pt.ClientKeyPath, pt.ClientKeyData
	}
	t.TLS.ServerName = cmp.Or(t.TLS.ServerName, pt.ServerName)
	if !t.TLS.skipVerifySet {
		t.TLS.InsecureSkipVerify = t.TLS.InsecureSkipVerify || pt.DisableHostVerification
	}
	if t.TLS.Enabled == nil && (!pt.Disabled || !above) {
		on := !pt.Disabled
		t.TLS.Enabled = &on
	}
	return nil
}

// envLookup is the envconfig view of a lookup function. It lists no variables: envconfig
// lists them only for TEMPORAL_GRPC_META_*, which the outbox does not read (see
// [Temporal.GRPCMeta]).
type envLookup func(string) (string, bool)

func (e envLookup) LookupEnv(name string) (string, bool) { return e(name) }
func (envLookup) Environ() []string                      { return nil }

// DefaultTemporalConfigFile returns the Temporal CLI's default config file,
// envconfig.DefaultConfigFilePath ([os.UserConfigDir]/temporalio/temporal.toml), with the
// variables it depends on (XDG_CONFIG_HOME, HOME, AppData) read through lookup. It is
// empty when there is no user config directory.
func DefaultTemporalConfigFile(lookup func(string) (string, bool)) string {
	get := func(name string) string { v, _ := lookup(name); return v }
	var dir string
	switch runtime.GOOS {
	case "windows":
		dir = get("AppData")
	case "darwin", "ios":
		if home := get("HOME"); home != "" {
			dir = home + "/Library/Application Support"
		}
	case "plan9":
		if home := get("home"); home != "" {
			dir = home + "/lib"
		}
	default:
		dir = get("XDG_CONFIG_HOME")
		if dir == "" {
			if home := get("HOME"); home != "" {
				dir = home + "/.config"
			}
		} else if !filepath.IsAbs(dir) {
			dir = ""
		}
	}
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, "temporalio", "temporal.toml")
}

// Headers returns the gRPC metadata of every call, grpc_meta with its names normalized as
// the Temporal CLI does (lower-cased, underscores made hyphens), or nil.
func (t Temporal) Headers() map[string]string {
	if len(t.GRPCMeta) == 0 {
		return nil
	}
	h := make(map[string]string, len(t.GRPCMeta))
	for k, v := range t.GRPCMeta {
		h[envconfig.NormalizeGRPCMetaKey(k)] = v
	}
	return h
}

var grpcMetaName = regexp.MustCompile(`^[0-9a-z._-]+$`)

// validateGRPCMeta checks the header names of grpc_meta: gRPC metadata names, and no two
// the same once normalized.
func (t Temporal) validateGRPCMeta() error {
	var errs []error
	seen := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(t.GRPCMeta)) {
		n := envconfig.NormalizeGRPCMetaKey(k)
		switch {
		case !grpcMetaName.MatchString(n):
			errs = append(errs, fmt.Errorf("temporal.grpc_meta[%q]: a header name must be letters, digits, '-', '_' and '.', got %q", k, k))
		case seen[n] != "":
			errs = append(errs, fmt.Errorf("temporal.grpc_meta[%q]: names the same header as %q (%s); keep one", k, seen[n], n))
		default:
			seen[n] = k
		}
	}
	return errors.Join(errs...)
}
