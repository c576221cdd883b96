package config

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSecurityConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(data), 0o600))
		return p
	}
	secret := make([]byte, 32)
	_, err := rand.Read(secret)
	require.NoError(t, err)
	b64 := base64.StdEncoding.EncodeToString(secret)
	k1 := write("k1.key", b64)
	notPEM := write("not.pem", "PRIVATE-CONTENTS-NEVER-SHOWN")

	parse := func(t *testing.T, yaml string, env map[string]string) *Config {
		t.Helper()
		c, err := Parse(strings.NewReader(yaml))
		require.NoError(t, err)
		c.ApplyEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		d := c.WithDefaults()
		return &d
	}

	t.Run("TLSFromFileAndEnv", func(t *testing.T) {
		t.Parallel()
		c := parse(t, "temporal:\n  tls:\n    server_name: temporal.internal\n", map[string]string{"TEMPORAL_API_KEY": "k"})
		require.NoError(t, c.Validate())
		require.Equal(t, "k", c.Temporal.APIKey)
		tlsCfg, err := c.Temporal.TLSConfig()
		require.NoError(t, err)
		require.Equal(t, "temporal.internal", tlsCfg.ServerName)
		require.Nil(t, tlsCfg.RootCAs, "the system's roots")

		c = parse(t, "", map[string]string{"TEMPORAL_API_KEY": "k"})
		require.True(t, c.Temporal.TLS.On(c.Temporal.APIKey), "an API key turns TLS on")
		c = parse(t, "temporal:\n  tls:\n    enabled: false\n", map[string]string{"TEMPORAL_API_KEY": "k"})
		require.False(t, c.Temporal.TLS.On(c.Temporal.APIKey))
		require.True(t, c.Temporal.TLS.Disabled())
		require.NoError(t, c.Validate())
		c = parse(t, "", nil)
		tlsCfg, err = c.Temporal.TLSConfig()
		require.NoError(t, err)
		require.Nil(t, tlsCfg, "plaintext by default")
	})

	t.Run("TLSErrors", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			env  map[string]string
			yaml string
			want string
		}{
			"MissingCA":       {env: map[string]string{"TEMPORAL_TLS_CA": filepath.Join(dir, "nope.pem")}, want: "temporal.tls.ca_file: open " + filepath.Join(dir, "nope.pem")},
			"CANotPEM":        {env: map[string]string{"TEMPORAL_TLS_CA": notPEM}, want: "temporal.tls.ca_file: no PEM certificate in " + notPEM},
			"CertWithoutKey":  {env: map[string]string{"TEMPORAL_TLS_CERT": notPEM}, want: "temporal.tls.key_file: must be set with cert_file"},
			"KeyWithoutCert":  {env: map[string]string{"TEMPORAL_TLS_KEY": notPEM}, want: "temporal.tls.cert_file: must be set with key_file"},
			"BadKeyPair":      {env: map[string]string{"TEMPORAL_TLS_CERT": notPEM, "TEMPORAL_TLS_KEY": notPEM}, want: "temporal.tls.cert_file and key_file: load the client certificate " + notPEM},
			"DisabledButSet":  {yaml: "temporal:\n  tls:\n    enabled: false\n", env: map[string]string{"TEMPORAL_TLS_CA": notPEM}, want: "temporal.tls.enabled: is false, but ca_file set"},
			"UnknownTLSField": {yaml: "temporal:\n  tls:\n    ca: x\n", want: "field ca not found"},
		} {
			c, err := Parse(strings.NewReader(tc.yaml))
			if err == nil {
				c.ApplyEnv(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
				d := c.WithDefaults()
				err = d.Validate()
			}
			require.ErrorContains(t, err, tc.want, name)
			require.NotContains(t, err.Error(), "PRIVATE-CONTENTS", name)
		}
	})

	t.Run("Codec", func(t *testing.T) {
		t.Parallel()
		c := parse(t, "codec:\n  keys:\n    - {id: k1, key_file: "+k1+"}\n", nil)
		require.NoError(t, c.Validate())
		cdc, err := c.Codec.New()
		require.NoError(t, err)
		require.Equal(t, "k1", cdc.ActiveKeyID())

		// The key from the environment joins the file's keys and encrypts.
		c = parse(t, "codec:\n  keys:\n    - {id: k1, key_file: "+k1+"}\n", map[string]string{"OUTBOX_CODEC_KEY": b64, "OUTBOX_CODEC_KEY_ID": "k2"})
		cdc, err = c.Codec.New()
		require.NoError(t, err)
		require.Equal(t, "k2", cdc.ActiveKeyID())
		require.Equal(t, []string{"k1", "k2"}, cdc.KeyIDs())

		cdc, err = parse(t, "", nil).Codec.New()
		require.NoError(t, err)
		require.Nil(t, cdc, "off by default")

		for name, tc := range map[string]struct {
			yaml string
			env  map[string]string
			want string
		}{
			"NoActive":      {yaml: "codec:\n  keys:\n    - {id: k1, key_file: " + k1 + "}\n    - {id: k2, key_file: " + k1 + "}\n", want: `codec.active: must name the key that encrypts, one of k1, k2; got ""`},
			"UnknownActive": {yaml: "codec:\n  active: k9\n  keys:\n    - {id: k1, key_file: " + k1 + "}\n", want: `got "k9"`},
			"MissingFile":   {yaml: "codec:\n  keys:\n    - {id: k1, key_file: /nonexistent/k1}\n", want: "codec.keys[0].key_file: key \"k1\": open /nonexistent/k1"},
			"NotAKey":       {yaml: "codec:\n  keys:\n    - {id: k1, key_file: " + notPEM + "}\n", want: "codec.keys[0].key_file: key \"k1\": not valid base64"},
			"BadID":         {yaml: "codec:\n  keys:\n    - {id: 'a b', key_file: " + k1 + "}\n", want: "codec.keys[0].id: must match"},
			"DuplicateID":   {yaml: "codec:\n  keys:\n    - {id: k1, key_file: " + k1 + "}\n    - {id: k1, key_file: " + k1 + "}\n", want: `codec.keys[1].id: "k1" is given twice`},
			"EnvKeyShort":   {env: map[string]string{"OUTBOX_CODEC_KEY": b64[:20]}, want: "OUTBOX_CODEC_KEY: key \"env\""},
			"EnvIDClashes":  {yaml: "codec:\n  keys:\n    - {id: env, key_file: " + k1 + "}\n", env: map[string]string{"OUTBOX_CODEC_KEY": b64}, want: "OUTBOX_CODEC_KEY_ID: \"env\" is also a key"},
		} {
			err := parse(t, tc.yaml, tc.env).Validate()
			require.ErrorContains(t, err, tc.want, name)
			require.NotContains(t, err.Error(), b64[:20], name)
			require.NotContains(t, err.Error(), "PRIVATE-CONTENTS", name)
		}
	})
}

// TestBrokerPasswordNotShown: a seed broker written with credentials is refused without
// showing them.
func TestBrokerPasswordNotShown(t *testing.T) {
	c, err := Parse(strings.NewReader("topics:\n  a: {sink: kafka, brokers: ['user:hunter2@kafka-1']}\n"))
	require.NoError(t, err)
	d := c.WithDefaults()
	err = d.Validate()
	require.ErrorContains(t, err, `topics["a"].brokers[0]: must be host:port`)
	require.ErrorContains(t, err, `got "(user information hidden)@kafka-1"`)
	require.NotContains(t, err.Error(), "hunter2")
}
