package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/config"
)

// mapEnv is a lookup over env.
func mapEnv(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// envLeaf is a key of the file found by walking Config's yaml tags.
type envLeaf struct {
	path  string
	index []int
	typ   reflect.Type
}

// configLeaves walks t's yaml tags into structs and pointers to structs, and returns every
// other key: the scalars, maps and lists. It is the test's own walk, apart from the
// package's, so that a key the package does not reach is caught.
func configLeaves(t reflect.Type, prefix string, index []int) []envLeaf {
	var leaves []envLeaf
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" || !f.IsExported() {
			continue
		}
		idx := append(append([]int(nil), index...), i)
		ft := f.Type
		if ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			leaves = append(leaves, configLeaves(ft, prefix+tag+".", idx)...)
			continue
		}
		leaves = append(leaves, envLeaf{prefix + tag, idx, f.Type})
	}
	return leaves
}

// sample returns a valid variable value for a key of type t and the value it must set.
func sample(t *testing.T, path string, typ reflect.Type) (string, reflect.Value) {
	t.Helper()
	want := reflect.New(typ).Elem()
	switch {
	case typ == reflect.TypeFor[config.Duration]():
		want.SetInt(int64(7 * time.Second))
		return "7s", want
	case typ.Kind() == reflect.Pointer && typ.Elem().Kind() == reflect.Bool:
		f := false
		want.Set(reflect.ValueOf(&f))
		return "false", want
	}
	switch typ.Kind() {
	case reflect.String:
		s := "s-" + strings.ReplaceAll(path, ".", "-")
		want.SetString(s)
		return s, want
	case reflect.Bool:
		want.SetBool(true)
		return "true", want
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want.SetInt(7)
		return "7", want
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want.SetUint(7)
		return "7", want
	case reflect.Float32, reflect.Float64:
		want.SetFloat(2.5)
		return "2.5", want
	case reflect.Map:
		elemText, elem := sampleElem(t, typ.Elem())
		want.Set(reflect.MakeMap(typ))
		want.SetMapIndex(reflect.ValueOf("k"), elem)
		return `{"k": ` + elemText + `}`, want
	case reflect.Slice:
		elemText, elem := sampleElem(t, typ.Elem())
		want.Set(reflect.Append(reflect.MakeSlice(typ, 0, 1), elem))
		return "[" + elemText + "]", want
	}
	t.Fatalf("%s: no sample value for a key of type %s; teach the test (and make sure OUTBOX_ variables can set it)", path, typ)
	return "", want
}

// sampleElem is an element of a map or list: an empty object for a struct.
func sampleElem(t *testing.T, typ reflect.Type) (string, reflect.Value) {
	t.Helper()
	if typ.Kind() == reflect.Struct {
		return "{}", reflect.New(typ).Elem()
	}
	text, v := sample(t, "elem", typ)
	if typ.Kind() == reflect.String {
		text = fmt.Sprintf("%q", text)
	}
	return text, v
}

// TestEveryKeyFromEnvironment sets every key of the file through its OUTBOX_<PATH>
// variable: a key added without a way to set it from the environment fails here.
func TestEveryKeyFromEnvironment(t *testing.T) {
	t.Parallel()
	leaves := configLeaves(reflect.TypeFor[config.Config](), "", nil)
	require.Greater(t, len(leaves), 60, "the walk reaches the keys")

	// temporal.profile names a profile that must exist: an empty one.
	toml := filepath.Join(t.TempDir(), "temporal.toml")
	require.NoError(t, os.WriteFile(toml, []byte("[profile.s-temporal-profile]\n"), 0o600))
	env := map[string]string{"TEMPORAL_CONFIG_FILE": toml}
	names := map[string]string{}
	want := map[string]reflect.Value{}
	for _, l := range leaves {
		name := "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(l.path, ".", "_"))
		require.Empty(t, names[name], "%s and %s share the variable %s", names[name], l.path, name)
		names[name] = l.path
		env[name], want[l.path] = sample(t, l.path, l.typ)
	}

	var c config.Config
	require.NoError(t, c.ApplyEnv(mapEnv(env)))
	root := reflect.ValueOf(&c).Elem()
	for _, l := range leaves {
		v := root
		for _, i := range l.index {
			if v.Kind() == reflect.Pointer {
				require.False(t, v.IsNil(), "%s: the struct holding it was not made", l.path)
				v = v.Elem()
			}
			v = v.Field(i)
		}
		name := "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(l.path, ".", "_"))
		require.True(t, reflect.DeepEqual(want[l.path].Interface(), v.Interface()),
			"%s from %s=%s: got %#v, want %#v", l.path, name, env[name], v.Interface(), want[l.path].Interface())
	}

	// The package lists the same keys under the same names.
	var listed []string
	for _, k := range config.EnvKeys() {
		listed = append(listed, k.Path+"="+k.Name)
	}
	var walked []string
	for _, l := range leaves {
		walked = append(walked, l.path+"="+config.EnvName(l.path))
		require.Equal(t, "OUTBOX_"+strings.ToUpper(strings.ReplaceAll(l.path, ".", "_")), config.EnvName(l.path))
	}
	require.Equal(t, walked, listed)
}

func TestEnvironment(t *testing.T) {
	t.Parallel()
	parse := func(t *testing.T, yaml string) *config.Config {
		t.Helper()
		c, err := config.Parse(strings.NewReader(yaml))
		require.NoError(t, err)
		return c
	}

	t.Run("ScalarsParseAsInTheFile", func(t *testing.T) {
		t.Parallel()
		c := parse(t, "relay: {poll_interval: 50ms}\nworker: {max_concurrent_activities: 10}\n")
		require.NoError(t, c.ApplyEnv(mapEnv(map[string]string{
			"OUTBOX_RELAY_POLL_INTERVAL":              "1s",
			"OUTBOX_WORKER_MAX_CONCURRENT_ACTIVITIES": "50",
			"OUTBOX_SEARCH_ATTRIBUTES":                "false",
			"OUTBOX_RETENTION_ENABLED":                "yes",
			"OUTBOX_DEFAULT_URL":                      "http://fallback:8080/events#not-a-comment",
			"OUTBOX_DEFAULT_BACKOFF":                  "1.5",
			"OUTBOX_RELAY_LEASE":                      "", // empty: unset
		})))
		require.Equal(t, config.Duration(time.Second), c.Relay.PollInterval)
		require.Equal(t, 50, c.Worker.MaxConcurrentActivities)
		require.False(t, c.SearchAttributesEnabled())
		require.True(t, c.Retention.Enabled)
		require.NotNil(t, c.Default)
		require.Equal(t, "http://fallback:8080/events#not-a-comment", c.Default.URL, "strings are taken as they are")
		require.Equal(t, 1.5, c.Default.Backoff)
		require.Zero(t, c.Relay.Lease)
		d := c.WithDefaults()
		require.NoError(t, d.Validate())
	})

	t.Run("NamedVariablesWin", func(t *testing.T) {
		t.Parallel()
		c := parse(t, "database_url: postgres://file/db\ntemporal: {address: file:7233, task_queue: file-q}\n")
		require.NoError(t, c.ApplyEnv(mapEnv(map[string]string{
			"OUTBOX_DATABASE_URL": "postgres://generic/db", "DATABASE_URL": "postgres://named/db",
			"OUTBOX_TEMPORAL_ADDRESS": "generic:7233", "TEMPORAL_ADDRESS": "named:7233",
			"OUTBOX_TEMPORAL_TASK_QUEUE": "generic-q", "OUTBOX_TASK_QUEUE": "named-q",
			"OUTBOX_TEMPORAL_NAMESPACE": "generic-ns", // no named variable: the generic one wins over the file
		})))
		require.Equal(t, "postgres://named/db", c.DatabaseURL)
		require.Equal(t, "named:7233", c.Temporal.Address)
		require.Equal(t, "named-q", c.Temporal.TaskQueue)
		require.Equal(t, "generic-ns", c.Temporal.Namespace)
	})

	t.Run("MapsMergeListsReplace", func(t *testing.T) {
		t.Parallel()
		c := parse(t, `
topics:
  order.created: {url: "http://a:8080/events", max_attempts: 3}
  order.paid: {url: "http://b:8080/events", max_attempts: 4}
default:
  url: http://fallback:8080/events
  headers: {Source: shop, Team: orders}
  signing_secrets: [env:A, env:B]
`)
		require.NoError(t, c.ApplyEnv(mapEnv(map[string]string{
			"OUTBOX_TOPICS":                  `{"order.paid": {"url": "http://c:8080/events"}, "order.cancelled": {"url": "http://d:8080/events"}}`,
			"OUTBOX_DEFAULT_HEADERS":         "{Team: payments, Region: eu}",
			"OUTBOX_DEFAULT_SIGNING_SECRETS": `["env:C"]`,
			"OUTBOX_TEMPORAL_GRPC_META":      `{"x-tenant": "orders"}`,
			"OUTBOX_CODEC_KEYS":              `[{"id": "k1", "key_file": "/etc/outbox/k1.key"}]`,
		})))
		require.Equal(t, config.Topic{URL: "http://a:8080/events", MaxAttempts: 3}, c.Topics["order.created"], "a topic the variable leaves out stays")
		require.Equal(t, config.Topic{URL: "http://c:8080/events"}, c.Topics["order.paid"], "a topic in the variable replaces the file's entry")
		require.Equal(t, config.Topic{URL: "http://d:8080/events"}, c.Topics["order.cancelled"])
		require.Equal(t, map[string]string{"Source": "shop", "Team": "payments", "Region": "eu"}, c.Default.Headers)
		require.Equal(t, []string{"env:C"}, c.Default.SigningSecrets)
		require.Equal(t, map[string]string{"x-tenant": "orders"}, c.Temporal.GRPCMeta)
		require.Equal(t, []config.CodecKey{{ID: "k1", KeyFile: "/etc/outbox/k1.key"}}, c.Codec.Keys)
	})

	t.Run("ValuesThatDoNotParse", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct{ value, want string }{
			"OUTBOX_RELAY_POLL_INTERVAL":              {"fast", `OUTBOX_RELAY_POLL_INTERVAL (relay.poll_interval): must be a duration such as "1s" or "1m30s", got "fast"`},
			"OUTBOX_WORKER_MAX_CONCURRENT_ACTIVITIES": {"lots", `OUTBOX_WORKER_MAX_CONCURRENT_ACTIVITIES (worker.max_concurrent_activities): must be an integer, got "lots"`},
			"OUTBOX_RETENTION_ENABLED":                {"maybe", `OUTBOX_RETENTION_ENABLED (retention.enabled): must be true or false, got "maybe"`},
			"OUTBOX_DEFAULT_BACKOFF":                  {"double", `OUTBOX_DEFAULT_BACKOFF (default.backoff): must be a number, got "double"`},
			"OUTBOX_TOPICS":                           {`["order.created"]`, `OUTBOX_TOPICS (topics): must be a YAML or JSON object, merged over the file's per entry (e.g. {"order.created": {"url": "http://inventory:8080/events"}})`},
			"OUTBOX_DEFAULT_BROKERS":                  {`{"a": 1}`, "OUTBOX_DEFAULT_BROKERS (default.brokers): must be a YAML or JSON list, replacing the file's"},
			"TEMPORAL_TLS":                            {"on", `TEMPORAL_TLS: must be true, false, 1 or 0, got "on"`},
		} {
			c := parse(t, "")
			err := c.ApplyEnv(mapEnv(map[string]string{name: tc.value}))
			require.ErrorContains(t, err, tc.want, name)
		}
		// A map or list variable's value is not repeated, not even the start the YAML
		// decoder quotes: it may be a header's secret.
		err := parse(t, "").ApplyEnv(mapEnv(map[string]string{"OUTBOX_TEMPORAL_GRPC_META": "hunter2s3cret"}))
		require.ErrorContains(t, err, "OUTBOX_TEMPORAL_GRPC_META (temporal.grpc_meta): must be a YAML or JSON object")
		require.NotContains(t, err.Error(), "hunter")
		// An unknown key in a topic is an error, as in the file.
		err = parse(t, "").ApplyEnv(mapEnv(map[string]string{"OUTBOX_TOPICS": `{"order.created": {"urll": "http://a"}}`}))
		require.ErrorContains(t, err, "field urll not found")

		// LoadEnv reports them, every one.
		_, err = config.LoadEnv("", mapEnv(map[string]string{"OUTBOX_RELAY_LEASE": "long", "OUTBOX_RELAY_BATCH_SIZE": "many"}))
		require.ErrorContains(t, err, "OUTBOX_RELAY_LEASE")
		require.ErrorContains(t, err, "OUTBOX_RELAY_BATCH_SIZE")
	})
}
