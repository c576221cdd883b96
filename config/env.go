package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// EnvPrefix starts the name of the variable of every key of the file: OUTBOX_ and the
// key's YAML path upper-cased, dots as underscores (relay.poll_interval:
// OUTBOX_RELAY_POLL_INTERVAL).
const EnvPrefix = "OUTBOX_"

// EnvName returns the variable of the key at path ("relay.poll_interval").
func EnvName(path string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(path))
}

// EnvKey is a key of the file settable from the environment.
type EnvKey struct {
	Path string // YAML path: "relay.poll_interval"
	Name string // variable: "OUTBOX_RELAY_POLL_INTERVAL"
	// Kind is what the variable holds: "string", "integer", "number", "boolean",
	// "duration", "object" (a YAML or JSON map, merged per entry) or "list" (a YAML or
	// JSON list, replacing the file's).
	Kind string
}

// EnvKeys lists the keys of the file settable as OUTBOX_<PATH>, in the order of the file's
// structure: every key but those under a map (a topic's keys are set with OUTBOX_TOPICS).
func EnvKeys() []EnvKey {
	var keys []EnvKey
	walkEnvKeys(reflect.TypeFor[Config](), "", func(path string, _ []int, t reflect.Type) {
		keys = append(keys, EnvKey{Path: path, Name: EnvName(path), Kind: envKind(t)})
	})
	return keys
}

// walkEnvKeys calls fn with the path, the field index and the type of each key under t: a
// scalar, a map or a list. Structs and pointers to structs are walked into.
func walkEnvKeys(t reflect.Type, prefix string, fn func(path string, index []int, t reflect.Type)) {
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || name == "" || name == "-" {
				continue
			}
			path, idx := prefix+name, append(append([]int(nil), index...), i)
			ft := f.Type
			if ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				walk(ft, path+".", idx)
				continue
			}
			fn(path, idx, f.Type)
		}
	}
	walk(t, prefix, nil)
}

// envKind names what the variable of a key of type t holds.
func envKind(t reflect.Type) string {
	if t == reflect.TypeFor[Duration]() {
		return "duration"
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Map:
		return "object"
	case reflect.Slice:
		return "list"
	}
	return t.Kind().String()
}

// allowed says what a variable of kind may hold, for its error.
var allowed = map[string]string{
	"duration": `a duration such as "1s" or "1m30s"`,
	"boolean":  "true or false",
	"integer":  "an integer",
	"number":   "a number",
}

// applyPathEnv sets the keys of c whose OUTBOX_<PATH> variable is set and not empty.
func applyPathEnv(c *Config, lookup func(string) (string, bool)) error {
	var errs []error
	root := reflect.ValueOf(c).Elem()
	walkEnvKeys(root.Type(), "", func(path string, index []int, t reflect.Type) {
		name := EnvName(path)
		v, _ := lookup(name)
		if v == "" {
			return
		}
		if err := setFromEnv(field(root, index), v); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", name, path, err))
		}
	})
	return errors.Join(errs...)
}

// field returns the field of v at index, allocating the pointers to structs on the way
// (default: is a *Topic).
func field(v reflect.Value, index []int) reflect.Value {
	for _, i := range index {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(i)
	}
	return v
}

// setFromEnv sets dst from the variable's value v: a string as it is, another scalar
// decoded as a YAML scalar (as the file's would be), a map decoded as YAML or JSON and
// merged per entry, a list decoded and replacing dst.
func setFromEnv(dst reflect.Value, v string) error {
	kind := envKind(dst.Type())
	switch kind {
	case "string":
		if dst.Kind() == reflect.Pointer {
			dst.Set(reflect.New(dst.Type().Elem()))
			dst = dst.Elem()
		}
		dst.SetString(v)
		return nil
	case "object", "list":
		parsed := reflect.New(dst.Type())
		dec := yaml.NewDecoder(bytes.NewReader([]byte(v)))
		dec.KnownFields(true)
		if err := dec.Decode(parsed.Interface()); err != nil && !errors.Is(err, io.EOF) {
			want := "a YAML or JSON list, replacing the file's"
			if kind == "object" {
				want = "a YAML or JSON object, merged over the file's per entry"
			}
			// The value is not repeated: it may hold header values or other secrets, and the
			// YAML decoder's errors quote the start of what they could not read.
			detail := yamlQuoted.ReplaceAllString(strings.TrimPrefix(err.Error(), "yaml: "), "a value")
			return fmt.Errorf("must be %s (e.g. %s): %v", want, envExample(dst.Type()), detail)
		}
		if kind == "list" {
			dst.Set(parsed.Elem())
			return nil
		}
		if dst.IsNil() && parsed.Elem().Len() > 0 {
			dst.Set(reflect.MakeMap(dst.Type()))
		}
		iter := parsed.Elem().MapRange()
		for iter.Next() {
			dst.SetMapIndex(iter.Key(), iter.Value())
		}
		return nil
	}
	node := &yaml.Node{Kind: yaml.ScalarNode, Value: v}
	tmp := reflect.New(dst.Type())
	if err := node.Decode(tmp.Interface()); err != nil {
		return fmt.Errorf("must be %s, got %q", allowed[kind], v)
	}
	dst.Set(tmp.Elem())
	return nil
}

// yamlQuoted matches what the YAML decoder's errors quote of the text they could not read
// (cannot unmarshal !!str `hunter2...` into ...).
var yamlQuoted = regexp.MustCompile("`[^`]*`")

// envExample is an example value of a map or list variable of type t.
func envExample(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[map[string]Topic]():
		return `{"order.created": {"url": "http://inventory:8080/events"}}`
	case reflect.TypeFor[[]CodecKey]():
		return `[{"id": "k1", "key_file": "/etc/outbox/keys/k1.key"}]`
	}
	if t.Kind() == reflect.Map {
		return `{"name": "value"}`
	}
	return `["a", "b"]`
}
