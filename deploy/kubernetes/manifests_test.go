package kubernetes

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/outbox-go/outbox/config"
	"github.com/outbox-go/outbox/starter"
)

// kinds maps the apiVersion and kind of each object these manifests may hold to its API
// type. A document of any other kind is an error.
var kinds = map[string]func() any{
	"v1 ConfigMap":                  func() any { return new(corev1.ConfigMap) },
	"apps/v1 Deployment":            func() any { return new(appsv1.Deployment) },
	"batch/v1 Job":                  func() any { return new(batchv1.Job) },
	"policy/v1 PodDisruptionBudget": func() any { return new(policyv1.PodDisruptionBudget) },
}

// The Secret that holds DATABASE_URL is not among the manifests: the pods refer to it.
const databaseURLKey = "DATABASE_URL"

// closeMargin is what a stopping outbox run needs after worker.stop_timeout: the process
// closes its metrics endpoint (within 5s), its Temporal client and its database pool.
// Before the worker's stop_timeout begins, its relay stops, within starter.StopGrace.
const closeMargin = 5 * time.Second

// located is a decoded object and where it was read, for messages.
type located[T any] struct {
	where string
	obj   T
}

type manifests struct {
	configMaps  []located[*corev1.ConfigMap]
	deployments []located[*appsv1.Deployment]
	jobs        []located[*batchv1.Job]
	pdbs        []located[*policyv1.PodDisruptionBudget]
}

func TestManifests(t *testing.T) {
	m := loadManifests(t)
	for _, k := range []struct {
		kind string
		n    int
	}{
		{"v1 ConfigMap", len(m.configMaps)}, {"apps/v1 Deployment", len(m.deployments)},
		{"batch/v1 Job", len(m.jobs)}, {"policy/v1 PodDisruptionBudget", len(m.pdbs)},
	} {
		if k.n == 0 {
			t.Errorf("no %s among the *.yaml files: want one", k.kind)
		}
		if k.n > 1 && k.kind != "v1 ConfigMap" {
			t.Errorf("%d objects of kind %s among the *.yaml files: want one, the checks pair it with the others", k.n, k.kind)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	img := readImage(t, filepath.Join("..", "..", "Dockerfile"))
	bin := buildOutbox(t)
	configMaps := map[string]located[*corev1.ConfigMap]{}
	for _, cm := range m.configMaps {
		if _, dup := configMaps[cm.obj.Name]; dup {
			t.Errorf("%s: ConfigMap %q is defined twice", cm.where, cm.obj.Name)
		}
		configMaps[cm.obj.Name] = cm
	}

	t.Run("ConfigMap", func(t *testing.T) {
		for _, cm := range m.configMaps {
			for key, data := range cm.obj.Data {
				if !strings.HasSuffix(key, ".yaml") {
					continue
				}
				// Without the pod's environment: the file alone must be a valid config.
				if _, err := loadConfig(data, func(string) (string, bool) { return "", false }); err != nil {
					t.Errorf("%s: ConfigMap %q key %s is not a valid outbox config:\n%v", cm.where, cm.obj.Name, key, err)
				}
			}
		}
	})

	dep := m.deployments[0]
	var run *pod
	t.Run("Deployment", func(t *testing.T) {
		d := dep.obj
		checkSelector(t, dep.where, d.Spec.Selector, d.Spec.Template.Labels)
		run = checkPod(t, dep.where, d.Spec.Template.Spec, "run", img, bin, configMaps)
		if run == nil {
			return
		}
		// Where Temporal is comes from TEMPORAL_ADDRESS in the pod; the config's default,
		// 127.0.0.1:7233, would be the pod itself.
		if v, ok := run.env["TEMPORAL_ADDRESS"]; !ok || v.Value == "" {
			t.Errorf("%s: container %s: TEMPORAL_ADDRESS is %s: want the Temporal frontend's host:port as its value", dep.where, run.container.Name, describeEnv(v, ok))
		}
		if host, _, err := net.SplitHostPort(run.cfg.Temporal.Address); err != nil || isLoopback(host) {
			t.Errorf("%s: container %s: the Temporal address is %q (TEMPORAL_ADDRESS, else temporal.address): want host:port of the Temporal frontend, not the pod's loopback", dep.where, run.container.Name, run.cfg.Temporal.Address)
		}

		port := checkMetricsAddress(t, dep.where, run)
		if port != 0 {
			c := run.container
			checkProbe(t, dep.where, c, "livenessProbe", c.LivenessProbe, "/healthz", port, true)
			checkProbe(t, dep.where, c, "readinessProbe", c.ReadinessProbe, "/readyz", port, true)
			checkProbe(t, dep.where, c, "startupProbe", c.StartupProbe, "/healthz", port, false)
			if a, ok := d.Spec.Template.Annotations["prometheus.io/port"]; ok && a != strconv.Itoa(port) {
				t.Errorf("%s: pod annotation prometheus.io/port is %q, want %d, the port of metrics.address %q", dep.where, a, port, run.cfg.Metrics.Address)
			}
		}

		stop := time.Duration(run.cfg.Worker.StopTimeout)
		want := starter.StopGrace + stop + closeMargin
		switch g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; {
		case g == nil:
			t.Errorf("%s: terminationGracePeriodSeconds is not set (Kubernetes' default is 30s): want more than the relay's stop (%s) + worker.stop_timeout (%s) + %s = %s", dep.where, starter.StopGrace, stop, closeMargin, want)
		case time.Duration(*g)*time.Second <= want:
			t.Errorf("%s: terminationGracePeriodSeconds is %d: want more than the relay's stop (%s) + worker.stop_timeout (%s) + %s = %s, or a stopping pod is killed while its sends finish", dep.where, *g, starter.StopGrace, stop, closeMargin, want)
		}
	})

	job := m.jobs[0]
	t.Run("Job", func(t *testing.T) {
		j := job.obj
		if p := j.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever && p != corev1.RestartPolicyOnFailure {
			t.Errorf("%s: restartPolicy is %q: a Job's must be Never or OnFailure", job.where, p)
		}
		if j.Spec.BackoffLimit == nil {
			t.Errorf("%s: backoffLimit is not set: want the number of retries of a failed migrate", job.where)
		}
		migrate := checkPod(t, job.where, j.Spec.Template.Spec, "migrate", img, bin, configMaps)
		if migrate == nil || run == nil {
			return
		}
		// migrate records the task queue in the database that run then requires: both must
		// see the same database, schema and task queue.
		if a, b := migrate.container.Image, run.container.Image; a != b {
			t.Errorf("%s: image is %q, %s's is %q: want the same, so that migrate applies the migrations of the version that runs", job.where, a, dep.where, b)
		}
		for _, v := range []struct{ what, job, dep string }{
			{"the DATABASE_URL Secret", migrate.secretRef(databaseURLKey), run.secretRef(databaseURLKey)},
			{"schema", migrate.cfg.Schema, run.cfg.Schema},
			{"task queue", migrate.cfg.Temporal.TaskQueue, run.cfg.Temporal.TaskQueue},
		} {
			if v.job != v.dep {
				t.Errorf("%s: %s is %q, %s's is %q: want the same", job.where, v.what, v.job, dep.where, v.dep)
			}
		}
	})

	pdb := m.pdbs[0]
	t.Run("PodDisruptionBudget", func(t *testing.T) {
		p := pdb.obj
		if p.Spec.Selector == nil || (len(p.Spec.Selector.MatchLabels) == 0 && len(p.Spec.Selector.MatchExpressions) == 0) {
			t.Fatalf("%s: selector is empty: want the labels of %s's pods, %v", pdb.where, dep.where, dep.obj.Spec.Template.Labels)
		}
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			t.Fatalf("%s: selector %v: %v", pdb.where, p.Spec.Selector, err)
		}
		if podLabels := dep.obj.Spec.Template.Labels; !sel.Matches(labels.Set(podLabels)) {
			t.Errorf("%s: selector %q does not match %s's pod labels %v", pdb.where, sel, dep.where, podLabels)
		}
		if jobLabels := job.obj.Spec.Template.Labels; sel.Matches(labels.Set(jobLabels)) {
			t.Errorf("%s: selector %q also matches %s's pod labels %v: want the Deployment's pods only", pdb.where, sel, job.where, jobLabels)
		}
		replicas := int32(1)
		if r := dep.obj.Spec.Replicas; r != nil {
			replicas = *r
		}
		switch {
		case p.Spec.MinAvailable != nil && p.Spec.MaxUnavailable != nil:
			t.Errorf("%s: sets both minAvailable and maxUnavailable: want one", pdb.where)
		case p.Spec.MinAvailable != nil && p.Spec.MinAvailable.Type == intstr.Int && p.Spec.MinAvailable.IntVal >= replicas:
			t.Errorf("%s: minAvailable is %d with %d replicas in %s: no pod could ever be evicted, and node drains would hang; want less than %d", pdb.where, p.Spec.MinAvailable.IntVal, replicas, dep.where, replicas)
		case p.Spec.MaxUnavailable != nil && p.Spec.MaxUnavailable.Type == intstr.Int && p.Spec.MaxUnavailable.IntVal < 1:
			t.Errorf("%s: maxUnavailable is %d: no pod could ever be evicted; want at least 1", pdb.where, p.Spec.MaxUnavailable.IntVal)
		case p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil:
			t.Errorf("%s: sets neither minAvailable nor maxUnavailable: want one", pdb.where)
		}
	})
}

// loadManifests decodes every document of every *.yaml file in this directory strictly
// (an unknown or duplicate field is an error) into the API type of its apiVersion and kind.
func loadManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if yml, _ := filepath.Glob("*.yml"); len(yml) > 0 {
		t.Errorf("%s: name the manifests *.yaml, as the others", strings.Join(yml, ", "))
	}
	if len(files) == 0 {
		t.Fatal("no *.yaml files in deploy/kubernetes")
	}
	m := &manifests{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		docs := splitDocuments(data)
		if len(docs) == 0 {
			t.Errorf("%s: holds no document", file)
		}
		for i, doc := range docs {
			where := file
			if len(docs) > 1 {
				where = fmt.Sprintf("%s (document %d)", file, i+1)
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Errorf("%s: not YAML: %v", where, err)
				continue
			}
			key := tm.APIVersion + " " + tm.Kind
			newObj, ok := kinds[key]
			if !ok {
				t.Errorf("%s: apiVersion %q kind %q is not one of %s", where, tm.APIVersion, tm.Kind, strings.Join(slices.Sorted(maps.Keys(kinds)), ", "))
				continue
			}
			obj := newObj()
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s: does not decode as %s: %v", where, key, err)
				continue
			}
			if name := obj.(metav1.Object).GetName(); name == "" {
				t.Errorf("%s: %s has no metadata.name", where, key)
			}
			switch o := obj.(type) {
			case *corev1.ConfigMap:
				m.configMaps = append(m.configMaps, located[*corev1.ConfigMap]{where, o})
			case *appsv1.Deployment:
				m.deployments = append(m.deployments, located[*appsv1.Deployment]{where, o})
			case *batchv1.Job:
				m.jobs = append(m.jobs, located[*batchv1.Job]{where, o})
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, located[*policyv1.PodDisruptionBudget]{where, o})
			}
		}
	}
	return m
}

// splitDocuments splits a YAML stream on its "---" lines and leaves out the documents
// that hold nothing but comments and blank lines.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		for line := range strings.Lines(cur.String()) {
			if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "#") {
				docs = append(docs, bytes.Clone(cur.Bytes()))
				break
			}
		}
		cur.Reset()
	}
	for line := range strings.Lines(string(data)) {
		if s := strings.TrimRight(line, "\r\n"); s == "---" || strings.HasPrefix(s, "--- ") || strings.HasPrefix(s, "---\t") {
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return docs
}

// image is what the Dockerfile's last stage says about the container.
type image struct {
	user       string   // USER, e.g. nonroot:nonroot
	entrypoint []string // ENTRYPOINT, exec form
}

func readImage(t *testing.T, dockerfile string) image {
	t.Helper()
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatalf("read the Dockerfile the image is built from: %v", err)
	}
	var img image
	for line := range strings.Lines(string(data)) {
		instr, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			img = image{} // a new stage
		case "USER":
			img.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &img.entrypoint); err != nil {
				t.Fatalf("%s: ENTRYPOINT %s: want the exec form, a JSON array: %v", dockerfile, rest, err)
			}
		}
	}
	if len(img.entrypoint) == 0 {
		t.Fatalf("%s: the last stage has no ENTRYPOINT", dockerfile)
	}
	return img
}

// pod is what a checked pod's one container runs and sees.
type pod struct {
	container corev1.Container
	env       map[string]corev1.EnvVar
	cfg       config.Config // the config file it reads, the environment applied, defaults filled
}

// secretRef names the Secret and key an environment variable comes from, or "".
func (p *pod) secretRef(name string) string {
	if v, ok := p.env[name]; ok && v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil {
		return v.ValueFrom.SecretKeyRef.Name + "/" + v.ValueFrom.SecretKeyRef.Key
	}
	return ""
}

// checkPod checks the pod spec of a Deployment or Job: one container running the outbox
// subcommand sub with flags the command accepts, its --config file mounted from a
// ConfigMap and valid with the pod's environment applied, DATABASE_URL from a Secret, and
// a non-root user the kubelet can verify. It returns nil when the rest cannot be checked.
func checkPod(t *testing.T, where string, spec corev1.PodSpec, sub string, img image, bin string, configMaps map[string]located[*corev1.ConfigMap]) *pod {
	t.Helper()
	if n := len(spec.Containers); n != 1 {
		t.Errorf("%s: %d containers: want one, running outbox %s", where, n, sub)
		return nil
	}
	c := spec.Containers[0]
	p := &pod{container: c, env: map[string]corev1.EnvVar{}}

	checkNonRoot(t, where, spec, c, img)

	args := c.Args
	if len(c.Command) > 0 {
		// command replaces the image's ENTRYPOINT.
		if path.Base(c.Command[0]) != "outbox" {
			t.Errorf("%s: container %s: command %q does not run outbox", where, c.Name, c.Command)
			return nil
		}
		args = append(slices.Clone(c.Command[1:]), c.Args...)
	} else if len(img.entrypoint) != 1 || path.Base(img.entrypoint[0]) != "outbox" {
		t.Errorf("%s: container %s: no command, and the image's ENTRYPOINT is %q, not [\"outbox\"]: args %q would not go to outbox", where, c.Name, img.entrypoint, c.Args)
		return nil
	}
	cmd, err := parseCommand(bin, args)
	if err != nil {
		t.Errorf("%s: container %s: outbox %s: %v", where, c.Name, strings.Join(args, " "), err)
		return nil
	}
	if cmd.name != sub {
		t.Errorf("%s: container %s: runs outbox %s, want outbox %s", where, c.Name, cmd.name, sub)
		return nil
	}
	// The command checks these two when it starts; run them by the same rules here.
	if f := cmd.flags["log-format"]; !slices.Contains([]string{"text", "json"}, strings.ToLower(f)) {
		t.Errorf("%s: container %s: --log-format %q: the command accepts text or json", where, c.Name, f)
	}
	if l := cmd.flags["log-level"]; new(slog.Level).UnmarshalText([]byte(l)) != nil {
		t.Errorf("%s: container %s: --log-level %q: the command accepts debug, info, warn or error", where, c.Name, l)
	}

	for _, e := range c.Env {
		if _, dup := p.env[e.Name]; dup {
			t.Errorf("%s: container %s: environment variable %s is set twice", where, c.Name, e.Name)
		}
		p.env[e.Name] = e
	}
	if len(c.EnvFrom) > 0 {
		t.Errorf("%s: container %s: envFrom is not checked here: set each variable in env", where, c.Name)
	}
	switch v, ok := p.env[databaseURLKey]; {
	case !ok:
		t.Errorf("%s: container %s: DATABASE_URL is not set: want it from a Secret (secretKeyRef, key %s)", where, c.Name, databaseURLKey)
	case v.Value != "" || v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil:
		// The value is not shown: it may hold a password.
		t.Errorf("%s: container %s: DATABASE_URL is %s: want it from a Secret (secretKeyRef, key %s), never in the manifest", where, c.Name, describeEnv(corev1.EnvVar{Value: "(not shown)", ValueFrom: v.ValueFrom}, ok), databaseURLKey)
	case v.ValueFrom.SecretKeyRef.Key != databaseURLKey:
		t.Errorf("%s: container %s: DATABASE_URL comes from key %q of Secret %q: want key %s, as the kubectl create secret command in the README creates", where, c.Name, v.ValueFrom.SecretKeyRef.Key, v.ValueFrom.SecretKeyRef.Name, databaseURLKey)
	}

	configPath := cmd.flags["config"]
	if configPath == "" {
		t.Errorf("%s: container %s: outbox %s has no --config: want the file mounted from the ConfigMap", where, c.Name, sub)
		return nil
	}
	files, errs := mountedFiles(spec, c, configMaps)
	for _, err := range errs {
		t.Errorf("%s: container %s: %v", where, c.Name, err)
	}
	data, ok := files[configPath]
	if !ok {
		t.Errorf("%s: container %s: --config %s is not a file of the mounted ConfigMaps; they show %s", where, c.Name, configPath, strings.Join(slices.Sorted(maps.Keys(files)), ", "))
		return nil
	}
	lookup := func(name string) (string, bool) {
		v, ok := p.env[name]
		switch {
		case !ok:
			return "", false
		case v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil && name == "DATABASE_URL":
			// A value of the form the secret holds: the config checks the URL's form.
			return "postgres://outbox@from-secret-" + v.ValueFrom.SecretKeyRef.Name + "/outbox", true
		case v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil:
			return "from-secret-" + v.ValueFrom.SecretKeyRef.Name, true
		default:
			return v.Value, true
		}
	}
	cfg, err := loadConfig(data, lookup)
	if err != nil {
		t.Errorf("%s: container %s: --config %s with the pod's environment is not a valid outbox config:\n%v", where, c.Name, configPath, err)
		return nil
	}
	p.cfg = cfg
	return p
}

// buildOutbox builds the outbox binary the image holds, as the Dockerfile builds it: the
// command's module alone (no workspace), with the nodev tag. The test runs it to check the
// containers' command lines: this module may not import the command's packages (they are
// internal to github.com/outbox-go/outbox/cmd/outbox).
func buildOutbox(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "outbox")
	build := exec.Command("go", "build", "-tags", "nodev", "-o", bin, ".")
	build.Dir = filepath.Join("..", "..", "cmd", "outbox")
	build.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the image's outbox binary (cd cmd/outbox && GOWORK=off go build -tags nodev): %v\n%s", err, out)
	}
	return bin
}

// command is an outbox command line as the outbox binary reads it.
type command struct {
	name  string            // the subcommand's name: run, migrate
	flags map[string]string // the value of each flag --help lists, its default unless args set it
}

// runOutbox runs the outbox binary with args, no environment and no input, and returns
// what it printed and its exit code. The exit codes are those of
// cmd/outbox/internal/cli/exit.go: 0 ok, 1 failure, 64 usage, 69 unavailable, 78 config.
func runOutbox(bin string, args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{} // not nil: nil would be the test's environment
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return string(out), -1, fmt.Errorf("outbox %s did not end within a minute", strings.Join(args, " "))
	case err != nil && !errors.As(err, &exit):
		return string(out), -1, err
	}
	return string(out), cmd.ProcessState.ExitCode(), nil
}

// parseCommand finds the outbox subcommand of args and checks the command line with the
// outbox binary bin, without running the command:
//
//   - outbox ARGS --help finds the subcommand and parses its flags (an unknown flag or a
//     value of the wrong type fails) and prints its usage: the command's path (its words
//     are lower case, its arguments' placeholders upper case or in brackets) and its flags
//     with their defaults;
//   - outbox ARGS --config MISSING runs the command's own checks of its arguments and
//     flags (positional arguments, --log-level, --log-format, flags that go together) up
//     to reading the config file, which does not exist: it stops there with a config error
//     (exit code 78) before it connects to anything.
func parseCommand(bin string, args []string) (*command, error) {
	// Flags go before a "--", after which everything is an argument.
	withFlags := func(flags ...string) []string {
		i := slices.Index(args, "--")
		if i < 0 {
			i = len(args)
		}
		return slices.Concat(args[:i], flags, args[i:])
	}
	help, code, err := runOutbox(bin, withFlags("--help")...)
	if err != nil {
		return nil, err
	}
	if code != 0 { // 0: ok
		return nil, fmt.Errorf("exit code %d:\n%s", code, help)
	}
	var path []string
	if _, usage, ok := strings.Cut(help, "Usage:\n"); ok {
		line, _, _ := strings.Cut(usage, "\n")
		words := strings.Fields(line)
		if len(words) == 0 || words[0] != "outbox" {
			return nil, fmt.Errorf("outbox --help: the usage line %q does not start with outbox", line)
		}
		for _, w := range words[1:] {
			if w == "" || strings.ToLower(w) != w || strings.ContainsAny(w, "[]<>") {
				break
			}
			path = append(path, w)
		}
	} else {
		return nil, fmt.Errorf("outbox --help printed no usage:\n%s", help)
	}
	if len(path) == 0 {
		return nil, fmt.Errorf("names no subcommand; want one of %s", strings.Join(subcommands(help), ", "))
	}
	// The flags' values as the command reads them: the last of each wins, a value joined
	// by = or in the next argument.
	defaults, takesValue := flagDefaults(help)
	cmd := &command{name: path[len(path)-1], flags: defaults}
	for i := 0; i < len(args) && args[i] != "--"; i++ {
		flag, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			continue
		}
		name, value, joined := strings.Cut(flag, "=")
		switch {
		case !takesValue[name]:
			value = cmp.Or(value, "true")
		case !joined && i+1 < len(args):
			i++
			value = args[i]
		}
		cmd.flags[name] = value
	}

	missing := filepath.Join(filepath.Dir(bin), "no-such-folder", "outbox.yaml") // beside the binary: never there
	out, code, err := runOutbox(bin, withFlags("--config", missing)...)
	switch {
	case err != nil:
		return nil, err
	case code == 78 && strings.Contains(out, missing): // 78: config, the file read
	case code == 0: // 0: ok, a command that reads no config
	default:
		return nil, fmt.Errorf("exit code %d before reading its config:\n%s", code, out)
	}
	return cmd, nil
}

// subcommands returns the commands the root's --help lists.
func subcommands(help string) []string {
	var names []string
	if _, list, ok := strings.Cut(help, "Available Commands:\n"); ok {
		for line := range strings.Lines(list) {
			if strings.TrimSpace(line) == "" {
				break
			}
			names = append(names, strings.Fields(line)[0])
		}
	}
	return names
}

// flagDefaults returns the long flags a command's --help lists, each with the default it
// shows ("" when it shows none), and which of them take a value (those --help shows with a
// value name: --config file, --log-level string; a boolean flag has none).
func flagDefaults(help string) (defaults map[string]string, takesValue map[string]bool) {
	defaults, takesValue = map[string]string{}, map[string]bool{}
	// "  -x, --name value   usage (default "d")": the flag and its value name come before
	// the first run of two spaces or more.
	line := regexp.MustCompile(`^\s*(?:-\w, )?--([\w-]+)( \S+)?(?:\s{2,}|$)`)
	def := regexp.MustCompile(`\(default "?(.*?)"?\)\s*$`)
	for l := range strings.Lines(help) {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		defaults[m[1]] = ""
		takesValue[m[1]] = m[2] != ""
		if d := def.FindStringSubmatch(l); d != nil {
			defaults[m[1]] = d[1]
		}
	}
	return defaults, takesValue
}

// loadConfig reads a config file's contents as the commands do: parse (unknown keys are
// errors), the environment applied, defaults filled, validated.
func loadConfig(data string, lookup func(string) (string, bool)) (config.Config, error) {
	cfg, err := config.Parse(strings.NewReader(data))
	if err != nil {
		return config.Config{}, err
	}
	if err := cfg.ApplyEnv(lookup); err != nil {
		return config.Config{}, err
	}
	c := cfg.WithDefaults()
	if err := c.Validate(); err != nil {
		return config.Config{}, err
	}
	return c, nil
}

// mountedFiles returns the files that the ConfigMap volumes mounted in container c show,
// by path, with their contents.
func mountedFiles(spec corev1.PodSpec, c corev1.Container, configMaps map[string]located[*corev1.ConfigMap]) (map[string]string, []error) {
	files := map[string]string{}
	var errs []error
	for _, vm := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("volumeMount %s: no volume of that name in the pod", vm.Name))
			continue
		}
		src := spec.Volumes[i].ConfigMap
		if src == nil {
			continue
		}
		cm, ok := configMaps[src.Name]
		if !ok {
			errs = append(errs, fmt.Errorf("volume %s: ConfigMap %q is not among the manifests", vm.Name, src.Name))
			continue
		}
		inVolume := map[string]string{}
		if len(src.Items) == 0 {
			for key, data := range cm.obj.Data {
				inVolume[key] = data
			}
		}
		for _, item := range src.Items {
			data, ok := cm.obj.Data[item.Key]
			if !ok {
				errs = append(errs, fmt.Errorf("volume %s: ConfigMap %q (%s) has no key %q", vm.Name, src.Name, cm.where, item.Key))
				continue
			}
			inVolume[item.Path] = data
		}
		if vm.SubPath != "" {
			data, ok := inVolume[vm.SubPath]
			if !ok {
				errs = append(errs, fmt.Errorf("volumeMount %s: subPath %q is not a file of ConfigMap %q (%s)", vm.Name, vm.SubPath, src.Name, cm.where))
				continue
			}
			files[vm.MountPath] = data
			continue
		}
		for p, data := range inVolume {
			files[path.Join(vm.MountPath, p)] = data
		}
	}
	return files, errs
}

// checkNonRoot checks that a pod that asks for a non-root user gets one the kubelet can
// verify: with the image's USER a name (nonroot), only a numeric runAsUser lets it.
func checkNonRoot(t *testing.T, where string, spec corev1.PodSpec, c corev1.Container, img image) {
	t.Helper()
	var nonRoot *bool
	var uid *int64
	if s := spec.SecurityContext; s != nil {
		nonRoot, uid = s.RunAsNonRoot, s.RunAsUser
	}
	if s := c.SecurityContext; s != nil {
		if s.RunAsNonRoot != nil {
			nonRoot = s.RunAsNonRoot
		}
		if s.RunAsUser != nil {
			uid = s.RunAsUser
		}
	}
	if nonRoot == nil || !*nonRoot {
		t.Errorf("%s: container %s: runAsNonRoot is not true: the image runs as USER %s, so it can", where, c.Name, img.user)
		return
	}
	user, _, _ := strings.Cut(img.user, ":")
	if _, err := strconv.Atoi(user); err != nil && uid == nil {
		t.Errorf("%s: container %s: runAsNonRoot without runAsUser, and the image's USER is %q, a name: the kubelet refuses to start the container (it cannot verify a named user is non-root); set runAsUser (65532 is distroless's nonroot)", where, c.Name, img.user)
	}
	if uid != nil && *uid == 0 {
		t.Errorf("%s: container %s: runAsUser is 0 (root) with runAsNonRoot: the kubelet refuses to start the container", where, c.Name)
	}
}

// checkMetricsAddress checks that metrics.address serves the pod's network and returns
// its port, or 0.
func checkMetricsAddress(t *testing.T, where string, p *pod) int {
	t.Helper()
	addr := p.cfg.Metrics.Address
	if addr == "" {
		t.Errorf("%s: metrics.address is empty: the probes need /healthz and /readyz, which it serves", where)
		return 0
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: metrics.address %q: %v", where, addr, err)
		return 0
	}
	if isLoopback(host) {
		t.Errorf("%s: metrics.address %q listens on the pod's loopback, where the kubelet's probes do not reach: want \":%s\" or \"0.0.0.0:%s\"", where, addr, portStr, portStr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		t.Errorf("%s: metrics.address %q: want a port number from 1 to 65535, got %q", where, addr, portStr)
		return 0
	}
	return port
}

// checkProbe checks that probe is an HTTP GET of path on port; a probe not required may
// be absent.
func checkProbe(t *testing.T, where string, c corev1.Container, name string, probe *corev1.Probe, wantPath string, wantPort int, required bool) {
	t.Helper()
	if probe == nil {
		if required {
			t.Errorf("%s: container %s: no %s: want an HTTP GET of %s on port %d", where, c.Name, name, wantPath, wantPort)
		}
		return
	}
	g := probe.HTTPGet
	if g == nil {
		t.Errorf("%s: container %s: %s is not an HTTP GET: want one of %s on port %d", where, c.Name, name, wantPath, wantPort)
		return
	}
	if g.Path != wantPath {
		t.Errorf("%s: container %s: %s path is %q, want %q", where, c.Name, name, g.Path, wantPath)
	}
	if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
		t.Errorf("%s: container %s: %s scheme is %s: the metrics endpoint serves plain HTTP", where, c.Name, name, g.Scheme)
	}
	port := g.Port.IntValue()
	if g.Port.Type == intstr.String {
		i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == g.Port.StrVal })
		if i < 0 {
			t.Errorf("%s: container %s: %s port %q names no port of the container", where, c.Name, name, g.Port.StrVal)
			return
		}
		port = int(c.Ports[i].ContainerPort)
	}
	if port != wantPort {
		got := strconv.Itoa(port)
		if g.Port.Type == intstr.String {
			got = fmt.Sprintf("%q (containerPort %d)", g.Port.StrVal, port)
		}
		t.Errorf("%s: container %s: %s port is %s, want %d, the port of metrics.address in the config", where, c.Name, name, got, wantPort)
	}
}

// checkSelector checks that a workload's selector matches its pod template's labels.
func checkSelector(t *testing.T, where string, selector *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(selector)
	switch {
	case selector == nil:
		t.Errorf("%s: no selector", where)
	case err != nil:
		t.Errorf("%s: selector %v: %v", where, selector, err)
	case sel.Empty() || !sel.Matches(labels.Set(podLabels)):
		t.Errorf("%s: selector %q does not match the pod template's labels %v", where, sel, podLabels)
	}
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// describeEnv says how an environment variable is set, for messages.
func describeEnv(v corev1.EnvVar, ok bool) string {
	switch {
	case !ok:
		return "not set"
	case v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil:
		return fmt.Sprintf("from key %q of Secret %q", v.ValueFrom.SecretKeyRef.Key, v.ValueFrom.SecretKeyRef.Name)
	case v.ValueFrom != nil:
		return "from a reference other than a Secret (a ConfigMap, a field or a resource)"
	case v.Value == "":
		return "empty"
	default:
		return fmt.Sprintf("the value %q", v.Value)
	}
}
