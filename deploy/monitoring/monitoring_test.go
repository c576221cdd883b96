package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-go/outbox/metrics"
	"github.com/outbox-go/outbox/store"
)

// series is what the outbox exports of one metric: its type and its labels.
type series struct {
	kind   dto.MetricType
	labels []string
}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"job", "instance"}

// exported returns every metric the outbox's processes export under outbox_, by name:
// those of metrics.New, the backlog collector and the ready gauge, each with a child of
// every vector made so that the registry reports its type and labels. Histograms appear
// under their _bucket, _sum and _count names, with le on the buckets. Prometheus's up is
// there too.
func exported(t *testing.T) map[string]series {
	t.Helper()
	reg := prometheus.NewRegistry()
	capture := &capturing{Registerer: reg}
	_, err := metrics.New(capture)
	require.NoError(t, err)
	require.NoError(t, capture.Register(metrics.NewBacklogCollector(backlog{}, time.Second)))
	require.NoError(t, capture.Register(metrics.NewReadyGauge(func(context.Context) error { return nil })))

	// Every metric a collector describes must be gathered below: a vector has no series
	// until it has a child, so make one with as many label values as it takes.
	described := map[string]bool{}
	for _, c := range capture.collectors {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String())
			require.NotNil(t, m, "descriptor %s", d)
			described[m[1]] = true
		}
		touch(t, c)
	}

	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]series{"up": {kind: dto.MetricType_GAUGE}}
	for _, f := range families {
		require.Contains(t, described, f.GetName())
		delete(described, f.GetName())
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		s := series{kind: f.GetType(), labels: labels}
		if f.GetType() != dto.MetricType_HISTOGRAM {
			out[f.GetName()] = s
			continue
		}
		out[f.GetName()+"_sum"] = s
		out[f.GetName()+"_count"] = s
		out[f.GetName()+"_bucket"] = series{kind: s.kind, labels: append(slices.Clone(labels), "le")}
	}
	require.Empty(t, described, "described but not gathered")
	require.Greater(t, len(out), 20, "the outbox's metrics")
	return out
}

// capturing is a Registerer that keeps what is registered with it.
type capturing struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (c *capturing) Register(col prometheus.Collector) error {
	c.collectors = append(c.collectors, col)
	return c.Registerer.Register(col)
}

// backlog is a store whose backlog is empty; the collector reads nothing else.
type backlog struct{ store.Delivery }

func (backlog) Backlog(context.Context) ([]store.TopicBacklog, error) {
	return []store.TopicBacklog{{Topic: "order.created", Pending: 1}}, nil
}

// touch makes one child of a vector, with as many label values as its labels.
func touch(t *testing.T, c prometheus.Collector) {
	t.Helper()
	try := func(f func(values ...string) error) {
		for n := 1; n <= 5; n++ {
			values := make([]string, n)
			for i := range values {
				values[i] = fmt.Sprint("v", i)
			}
			if f(values...) == nil {
				return
			}
		}
		t.Fatalf("no child of %T with up to 5 label values", c)
	}
	switch v := c.(type) {
	case *prometheus.CounterVec:
		try(func(vs ...string) error { _, err := v.GetMetricWithLabelValues(vs...); return err })
	case *prometheus.GaugeVec:
		try(func(vs ...string) error { _, err := v.GetMetricWithLabelValues(vs...); return err })
	case *prometheus.HistogramVec:
		try(func(vs ...string) error { _, err := v.GetMetricWithLabelValues(vs...); return err })
	}
}

// ref is a metric an expression names, with the labels it uses on it.
type ref struct {
	metric string
	labels []string
}

// refs returns the metrics an expression names and the labels it uses with each: in its
// selectors' matchers, and in the by/without of an aggregation or the on/ignoring of a
// binary operation around it.
func refs(t *testing.T, p parser.Parser, expr string) []ref {
	t.Helper()
	node, err := p.ParseExpr(expr)
	require.NoError(t, err, "expression %q", expr)
	var out []ref
	var walk func(n parser.Node, outer []string)
	walk = func(n parser.Node, outer []string) {
		switch e := n.(type) {
		case *parser.VectorSelector:
			r := ref{metric: e.Name, labels: slices.Clone(outer)}
			for _, m := range e.LabelMatchers {
				if m.Name != model.MetricNameLabel {
					r.labels = append(r.labels, m.Name)
				}
			}
			out = append(out, r)
			return
		case *parser.AggregateExpr:
			outer = append(slices.Clone(outer), e.Grouping...)
		case *parser.BinaryExpr:
			if e.VectorMatching != nil {
				outer = append(slices.Clone(outer), e.VectorMatching.MatchingLabels...)
			}
		}
		for _, c := range parser.Children(n) {
			walk(c, outer)
		}
	}
	walk(node, nil)
	require.NotEmpty(t, out, "expression %q names no metric", expr)
	return out
}

// checkExpr requires expr to name only exported metrics, each with its own labels (or a
// target label).
func checkExpr(t *testing.T, p parser.Parser, known map[string]series, where, expr string) {
	t.Helper()
	for _, r := range refs(t, p, expr) {
		s, ok := known[r.metric]
		require.True(t, ok, "%s: %q names %s, which the outbox does not export", where, expr, r.metric)
		for _, l := range r.labels {
			require.True(t, slices.Contains(s.labels, l) || slices.Contains(targetLabels, l),
				"%s: %q uses label %s on %s, whose labels are %v (and the target's %v)", where, expr, l, r.metric, s.labels, targetLabels)
		}
	}
}

// labelRefs are the labels a rule's annotation names.
var labelRefs = regexp.MustCompile(`\$labels\.(\w+)`)

// TestAlertRules parses prometheus/alerts.yaml with Prometheus's rule parser (which also
// checks each expression and template) and checks every expression and every label its
// annotations name against what the outbox exports.
func TestAlertRules(t *testing.T) {
	known := exported(t)
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.ParseFile(filepath.Join("prometheus", "alerts.yaml"), false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	require.Empty(t, errs)
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: only alerting rules", g.Name)
			alerts = append(alerts, r.Alert)
			checkExpr(t, p, known, r.Alert, r.Expr)
			// The labels an annotation names must be in the expression's result: the
			// grouping labels, or a metric's own when it is not aggregated.
			for _, text := range r.Annotations {
				for _, m := range labelRefs.FindAllStringSubmatch(text, -1) {
					require.True(t, resultHas(t, p, known, r.Expr, m[1]), "%s: an annotation names $labels.%s, which %q does not keep", r.Alert, m[1], r.Expr)
				}
			}
			require.NotEmpty(t, r.Annotations["summary"], "%s: a summary", r.Alert)
		}
	}
	// The alerts the operations docs promise.
	for _, want := range []string{"OutboxOldestPendingMessageTooOld", "OutboxDeadLettersRising", "OutboxRelayNotClaiming", "OutboxNotReady"} {
		require.Contains(t, alerts, want)
	}
}

// resultHas reports whether expr's result keeps label: an outermost aggregation keeps its
// by labels; a selector without one keeps its series' labels and the target's.
func resultHas(t *testing.T, p parser.Parser, known map[string]series, expr, label string) bool {
	t.Helper()
	node, err := p.ParseExpr(expr)
	require.NoError(t, err)
	for {
		switch e := node.(type) {
		case *parser.ParenExpr:
			node = e.Expr
			continue
		case *parser.BinaryExpr:
			// A comparison with a number, and "unless", keep the left side's labels.
			node = e.LHS
			continue
		case *parser.AggregateExpr:
			return !e.Without && slices.Contains(e.Grouping, label)
		case *parser.VectorSelector:
			return slices.Contains(known[e.Name].labels, label) || slices.Contains(targetLabels, label)
		}
		return true
	}
}

// TestDashboard checks the Grafana dashboard: valid JSON with a Prometheus data source
// variable, every panel's query naming only exported metrics and labels.
func TestDashboard(t *testing.T) {
	known := exported(t)
	p := parser.NewParser(parser.Options{})
	b, err := os.ReadFile(filepath.Join("grafana", "dashboards", "outbox.json"))
	require.NoError(t, err)
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []panel `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	require.NotEmpty(t, d.UID)
	require.NotEmpty(t, d.Title)

	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	require.Equal(t, "datasource", vars["datasource"], "a data source variable, so the dashboard imports into any Grafana")

	var panels []panel
	for _, pn := range d.Panels {
		panels = append(panels, pn)
		panels = append(panels, pn.Panels...) // a collapsed row holds its panels
	}
	var queries int
	for _, pn := range panels {
		if pn.Type == "row" {
			continue
		}
		require.NotEmpty(t, pn.Title)
		require.NotEmpty(t, pn.Targets, "panel %q has no query", pn.Title)
		for _, tg := range pn.Targets {
			require.Equal(t, "${datasource}", tg.Datasource.UID, "panel %q", pn.Title)
			checkExpr(t, p, known, "panel "+pn.Title, grafanaVars.Replace(tg.Expr))
			queries++
		}
	}
	require.GreaterOrEqual(t, queries, 10)

	// Every outbox metric is on the dashboard, so a new one is not forgotten.
	shown := map[string]bool{}
	for _, pn := range panels {
		for _, tg := range pn.Targets {
			for _, r := range refs(t, p, grafanaVars.Replace(tg.Expr)) {
				shown[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(r.metric, "_bucket"), "_sum"), "_count")] = true
			}
		}
	}
	for name, s := range known {
		if name == "up" || s.kind == dto.MetricType_HISTOGRAM && !strings.HasSuffix(name, "_bucket") {
			continue
		}
		base := strings.TrimSuffix(name, "_bucket")
		require.True(t, shown[base], "metric %s is on no panel of the dashboard", base)
	}
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
}

// grafanaVars replaces the dashboard's variables with values PromQL parses.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", `"$topic"`, `".*"`, "$topic", ".*")

// TestComposeProvisioning checks that the compose profile's Prometheus loads the rules
// and scrapes the outbox, and that Grafana is provisioned with the data source and the
// dashboard folder.
func TestComposeProvisioning(t *testing.T) {
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, filepath.Join("prometheus", "prometheus.yml"), &prom)
	require.Contains(t, prom.RuleFiles, "/etc/prometheus/alerts.yaml")
	require.NotEmpty(t, prom.ScrapeConfigs)
	for _, sc := range prom.ScrapeConfigs {
		require.True(t, strings.HasPrefix(sc.JobName, "outbox"), "job %s: the rules select job=~\"outbox.*\"", sc.JobName)
	}

	var ds struct {
		Datasources []struct {
			Name string `yaml:"name"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join("grafana", "provisioning", "datasources", "prometheus.yaml"), &ds)
	require.Len(t, ds.Datasources, 1)
	require.Equal(t, "prometheus", ds.Datasources[0].Type)

	var dash struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join("grafana", "provisioning", "dashboards", "outbox.yaml"), &dash)
	require.Len(t, dash.Providers, 1)
	require.Equal(t, "/var/lib/grafana/dashboards", dash.Providers[0].Options.Path)
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, v), path)
}
