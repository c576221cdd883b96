package config_test

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/contrib/envconfig"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/internal/testutil"
)

// TestTemporalProfile reads the Temporal CLI's temporal.toml profiles with the outbox's
// precedence: the TEMPORAL_* variables, then the file, then the profile, then the
// defaults.
func TestTemporalProfile(t *testing.T) {
	t.Parallel()
	pki := testutil.NewPKI(t, "staging.internal")
	read := func(path string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}
	dir := t.TempDir()
	toml := filepath.Join(dir, "temporal.toml")
	require.NoError(t, os.WriteFile(toml, []byte(`
[profile.default]
address = "default-host:7233"
api_key = "default-key"

[profile.staging]
address = "staging-host:7233"
namespace = "staging-ns"
api_key = "staging-key"
authority = "frontend.staging"

[profile.staging.tls]
server_name = "staging.internal"
server_ca_cert_data = """`+read(pki.CAFile)+`"""
client_cert_data = """`+read(pki.CertFile)+`"""
client_key_data = """`+read(pki.KeyFile)+`"""

[profile.staging.grpc_meta]
X_Tenant = "orders"

[profile.local]
address = "127.0.0.1:7233"
api_key = "local-key"

[profile.local.tls]
disabled = true

[profile.unverified]
address = "unverified-host:7233"

[profile.unverified.tls]
disable_host_verification = true

[profile.decoded]
address = "x:7233"

[profile.decoded.codec]
endpoint = "http://codec.internal:8081"
`), 0o600))

	load := func(t *testing.T, yaml string, env map[string]string) (config.Config, error) {
		t.Helper()
		c, err := config.Parse(strings.NewReader(yaml))
		require.NoError(t, err)
		if err := c.ApplyEnv(mapEnv(env)); err != nil {
			return config.Config{}, err
		}
		return c.WithDefaults(), nil
	}
	mustLoad := func(t *testing.T, yaml string, env map[string]string) config.Config {
		t.Helper()
		c, err := load(t, yaml, env)
		require.NoError(t, err)
		require.NoError(t, c.Validate())
		return c
	}

	t.Run("DefaultProfile", func(t *testing.T) {
		t.Parallel()
		c := mustLoad(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": toml})
		require.Equal(t, "default-host:7233", c.Temporal.Address)
		require.Equal(t, config.DefaultNamespace, c.Temporal.Namespace, "the built-in default fills what the profile leaves out")
		require.Equal(t, "default-key", c.Temporal.APIKey)
		require.True(t, c.Temporal.TLS.On(c.Temporal.APIKey), "an API key turns TLS on, as the Temporal CLI does")
	})

	t.Run("NamedProfile", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			yaml string
			env  map[string]string
		}{
			"TEMPORAL_PROFILE": {env: map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "staging"}},
			"temporal.profile": {yaml: "temporal: {profile: staging}\n", env: map[string]string{"TEMPORAL_CONFIG_FILE": toml}},
			"EnvironmentWins":  {yaml: "temporal: {profile: local}\n", env: map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "staging"}},
			"OUTBOX_TEMPORAL_PROFILE": {
				yaml: "temporal: {profile: local}\n",
				env:  map[string]string{"TEMPORAL_CONFIG_FILE": toml, "OUTBOX_TEMPORAL_PROFILE": "staging"},
			},
		} {
			c := mustLoad(t, tc.yaml, tc.env)
			require.Equal(t, "staging-host:7233", c.Temporal.Address, name)
			require.Equal(t, "staging-ns", c.Temporal.Namespace, name)
			require.Equal(t, "staging-key", c.Temporal.APIKey, name)
			require.Equal(t, "frontend.staging", c.Temporal.Authority, name)
			require.Equal(t, map[string]string{"x-tenant": "orders"}, c.Temporal.Headers(), name)
		}
	})

	t.Run("Precedence", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "staging"}
		// The file wins over the profile.
		c := mustLoad(t, "temporal: {address: file-host:7233, grpc_meta: {x-tenant: payments, x-region: eu}}\n", env)
		require.Equal(t, "file-host:7233", c.Temporal.Address)
		require.Equal(t, "staging-ns", c.Temporal.Namespace, "what the file leaves out comes from the profile")
		require.Equal(t, map[string]string{"x-tenant": "payments", "x-region": "eu"}, c.Temporal.Headers(), "merged per header")
		// OUTBOX_<PATH> wins over the file; TEMPORAL_* over both.
		env["OUTBOX_TEMPORAL_ADDRESS"], env["OUTBOX_TEMPORAL_NAMESPACE"] = "outbox-host:7233", "outbox-ns"
		env["TEMPORAL_NAMESPACE"] = "env-ns"
		c = mustLoad(t, "temporal: {address: file-host:7233, namespace: file-ns}\n", env)
		require.Equal(t, "outbox-host:7233", c.Temporal.Address)
		require.Equal(t, "env-ns", c.Temporal.Namespace)
		env["TEMPORAL_ADDRESS"] = "env-host:7233"
		c = mustLoad(t, "temporal: {address: file-host:7233}\n", env)
		require.Equal(t, "env-host:7233", c.Temporal.Address)

		// A CA file above the profile keeps the profile's CA data out; the profile's
		// client certificate still comes in.
		c = mustLoad(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "staging", "TEMPORAL_TLS_CA": pki.OtherCAFile})
		require.Equal(t, pki.OtherCAFile, c.Temporal.TLS.CAFile)
		require.Empty(t, c.Temporal.TLS.CAData)
		require.NotEmpty(t, c.Temporal.TLS.CertData)

		// The profile turns TLS off; an API key from it is then sent in plaintext, as the
		// Temporal CLI does. A TLS key set above the profile keeps TLS on.
		c = mustLoad(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "local"})
		require.True(t, c.Temporal.TLS.Disabled())
		require.Equal(t, "local-key", c.Temporal.APIKey)
		c = mustLoad(t, "temporal: {tls: {server_name: local.internal}}\n", map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "local"})
		require.False(t, c.Temporal.TLS.Disabled())
		require.True(t, c.Temporal.TLS.On(c.Temporal.APIKey))
		c = mustLoad(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "local", "TEMPORAL_TLS": "true"})
		require.True(t, c.Temporal.TLS.On(c.Temporal.APIKey))
	})

	t.Run("HostVerification", func(t *testing.T) {
		t.Parallel()
		env := func(kv ...string) map[string]string {
			m := map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "unverified"}
			for i := 0; i < len(kv); i += 2 {
				m[kv[i]] = kv[i+1]
			}
			return m
		}
		// The profile's disable_host_verification applies when nothing above it says.
		require.True(t, mustLoad(t, "", env()).Temporal.TLS.InsecureSkipVerify)
		// A false above the profile, from the file or either variable, verifies the server.
		for name, c := range map[string]config.Config{
			"file":                                   mustLoad(t, "temporal: {tls: {insecure_skip_verify: false}}\n", env()),
			"TEMPORAL_TLS_DISABLE_HOST_VERIFICATION": mustLoad(t, "", env("TEMPORAL_TLS_DISABLE_HOST_VERIFICATION", "false")),
			"OUTBOX_TEMPORAL_TLS_INSECURE_SKIP_VERIFY": mustLoad(t, "", env("OUTBOX_TEMPORAL_TLS_INSECURE_SKIP_VERIFY", "false")),
		} {
			require.False(t, c.Temporal.TLS.InsecureSkipVerify, name)
			tlsCfg, err := c.Temporal.TLSConfig()
			require.NoError(t, err, name)
			require.False(t, tlsCfg.InsecureSkipVerify, name)
		}
	})

	t.Run("InlineTLSData", func(t *testing.T) {
		t.Parallel()
		c := mustLoad(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "staging"})
		require.Empty(t, c.Temporal.TLS.CAFile)
		tlsCfg, err := c.Temporal.TLSConfig()
		require.NoError(t, err)
		require.NotNil(t, tlsCfg.RootCAs)
		require.True(t, tlsCfg.RootCAs.Equal(pki.Pool), "the CA from the profile's server_ca_cert_data")
		require.Equal(t, "staging.internal", tlsCfg.ServerName)
		require.Len(t, tlsCfg.Certificates, 1, "the client certificate from client_cert_data and client_key_data")
		leaf, err := x509.ParseCertificate(tlsCfg.Certificates[0].Certificate[0])
		require.NoError(t, err)
		require.Equal(t, testutil.ClientName, leaf.Subject.CommonName)

		// From the environment too; bad data is named, never shown.
		c = mustLoad(t, "", map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_DATA": read(pki.CAFile)})
		tlsCfg, err = c.Temporal.TLSConfig()
		require.NoError(t, err)
		require.True(t, tlsCfg.RootCAs.Equal(pki.Pool))
		c, err = load(t, "", map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_DATA": "PRIVATE-CONTENTS-NEVER-SHOWN"})
		require.NoError(t, err)
		err = c.Validate()
		require.ErrorContains(t, err, "temporal.tls.ca_data: no PEM certificate in the data")
		require.NotContains(t, err.Error(), "PRIVATE-CONTENTS")
		_, err = load(t, "", map[string]string{"TEMPORAL_TLS_CA": pki.CAFile, "TEMPORAL_TLS_SERVER_CA_CERT_DATA": read(pki.CAFile)})
		require.ErrorContains(t, err, "TEMPORAL_TLS_CA and TEMPORAL_TLS_SERVER_CA_CERT_DATA: both are set")
		_, err = load(t, "", map[string]string{"TEMPORAL_TLS_CA": pki.CAFile, "TEMPORAL_TLS_SERVER_CA_CERT_PATH": pki.OtherCAFile})
		require.ErrorContains(t, err, "TEMPORAL_TLS_CA and TEMPORAL_TLS_SERVER_CA_CERT_PATH: both are set, to different values")
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		_, err := load(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "nope"})
		require.ErrorContains(t, err, `temporal profile "nope" (TEMPORAL_PROFILE) of `+toml+" (TEMPORAL_CONFIG_FILE): the file has no such profile; it has decoded, default, local, staging")
		_, err = load(t, "temporal: {profile: nope}\n", map[string]string{"TEMPORAL_CONFIG_FILE": toml})
		require.ErrorContains(t, err, `temporal profile "nope" (temporal.profile) of `+toml)

		missing := filepath.Join(dir, "missing.toml")
		_, err = load(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": missing, "TEMPORAL_PROFILE": "staging"})
		require.ErrorContains(t, err, `temporal profile "staging" (TEMPORAL_PROFILE) of `+missing+" (TEMPORAL_CONFIG_FILE): the file does not exist")
		_, err = load(t, "temporal: {profile: staging}\n", nil)
		require.ErrorContains(t, err, `temporal profile "staging" (temporal.profile): no temporal.toml to find it in`)

		// A missing file without a profile named is no profile.
		c := mustLoad(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": missing})
		require.Equal(t, config.DefaultTemporalAddress, c.Temporal.Address)

		_, err = load(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": toml, "TEMPORAL_PROFILE": "decoded"})
		require.ErrorContains(t, err, `temporal profile "decoded" (TEMPORAL_PROFILE) of `+toml+" (TEMPORAL_CONFIG_FILE): codec.endpoint: a remote codec (http://codec.internal:8081) is not supported")
		require.ErrorContains(t, err, "codec.keys, or OUTBOX_CODEC_KEY")
		_, err = load(t, "", map[string]string{"TEMPORAL_CODEC_ENDPOINT": "http://codec.internal:8081"})
		require.ErrorContains(t, err, "TEMPORAL_CODEC_ENDPOINT: a remote codec (http://codec.internal:8081) is not supported")

		bad := filepath.Join(dir, "bad.toml")
		require.NoError(t, os.WriteFile(bad, []byte("[profile.default\n"), 0o600))
		_, err = load(t, "", map[string]string{"TEMPORAL_CONFIG_FILE": bad})
		require.ErrorContains(t, err, `temporal profile "default" of `+bad+" (TEMPORAL_CONFIG_FILE): failed parsing config")
	})

	t.Run("DefaultPath", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, envconfig.DefaultConfigFilePath(), config.DefaultTemporalConfigFile(os.LookupEnv),
			"the Temporal CLI's default path, from the process's environment")
		home := t.TempDir()
		env := map[string]string{"HOME": home, "XDG_CONFIG_HOME": filepath.Join(home, "xdg"), "AppData": filepath.Join(home, "appdata"), "home": home}
		path := config.DefaultTemporalConfigFile(mapEnv(env))
		require.True(t, strings.HasPrefix(path, home), path)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
		require.NoError(t, os.WriteFile(path, []byte("[profile.default]\nnamespace = \"from-default-path\"\n"), 0o600))
		c := mustLoad(t, "", env)
		require.Equal(t, "from-default-path", c.Temporal.Namespace)
		// Without a user config directory there is no default file.
		require.Empty(t, config.DefaultTemporalConfigFile(mapEnv(nil)))
	})
}

func TestGRPCMetaNames(t *testing.T) {
	t.Parallel()
	c, err := config.Parse(strings.NewReader("temporal:\n  grpc_meta: {X_Tenant: a, x-tenant: b, \"bad name\": c}\n"))
	require.NoError(t, err)
	d := c.WithDefaults()
	err = d.Validate()
	require.ErrorContains(t, err, `temporal.grpc_meta["x-tenant"]: names the same header as "X_Tenant" (x-tenant); keep one`)
	require.ErrorContains(t, err, `temporal.grpc_meta["bad name"]: a header name must be letters, digits, '-', '_' and '.', got "bad name"`)
}

func TestGRPCMetaNamesFromEnvironment(t *testing.T) {
	t.Parallel()
	toml := filepath.Join(t.TempDir(), "temporal.toml")
	require.NoError(t, os.WriteFile(toml, []byte("[profile.default.grpc_meta]\nx-region = \"eu\"\nx-tenant = \"profile\"\n"), 0o600))
	c, err := config.LoadEnv("", mapEnv(map[string]string{"TEMPORAL_CONFIG_FILE": toml, "OUTBOX_TEMPORAL_GRPC_META": `{X_Tenant: a, x-tenant: b}`}))
	require.NoError(t, err)
	d := c.WithDefaults()
	require.ErrorContains(t, d.Validate(), `names the same header as "X_Tenant"`, "two names of one header are reported, not merged at random")
	c, err = config.LoadEnv("", mapEnv(map[string]string{"TEMPORAL_CONFIG_FILE": toml, "OUTBOX_TEMPORAL_GRPC_META": `{X_Tenant: a}`}))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"x-tenant": "a", "x-region": "eu"}, c.Temporal.Headers())
}
