package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// dashboardFile is the dashboard under test, from this module's directory.
const dashboardFile = "../../manifests/grafana/gpushare.json"

// The parts of a Grafana dashboard the checks read.
type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []target       `json:"targets"`
	Panels     []panel        `json:"panels"` // a collapsed row keeps its panels here
	GridPos    struct {
		X int `json:"x"`
		W int `json:"w"`
		H int `json:"h"`
	} `json:"gridPos"`
}

type target struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasourceRef  `json:"datasource"`
}

// query is one PromQL text of the dashboard and where it sits, for messages.
type query struct {
	where string
	expr  string
	// variableQuery is a templating query: Grafana's label_values(...) or
	// query_result(...) around PromQL, not PromQL itself.
	variableQuery bool
}

// promDatasource is how every query names its data source: the template
// variable, so the dashboard imports into any Grafana.
const promDatasource = "${datasource}"

func loadDashboard(t *testing.T, data []byte) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func readDashboard(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// allPanels flattens rows, open or collapsed.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// queries lists every panel target's expr and every query variable's query.
func (d dashboard) queries() ([]query, error) {
	var out []query
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			out = append(out, query{where: fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID), expr: tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		text, err := variableQueryText(v.Query)
		if err != nil {
			return nil, fmt.Errorf("variable %s: %w", v.Name, err)
		}
		out = append(out, query{where: "variable " + v.Name, expr: text, variableQuery: true})
	}
	return out, nil
}

// variableQueryText reads a query variable's query, which Grafana stores as
// a string (older dashboards) or as an object with the text in "query".
func variableQueryText(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("query is neither a string nor an object with a query: %s", raw)
	}
	return obj.Query, nil
}

// variableValues are what each Grafana variable a query may name is
// replaced by before parsing: Grafana's interval variables by a duration,
// the dashboard's own variables by a plain word (they sit inside label
// matcher strings). A variable not listed is an error: Grafana would send
// it unexpanded.
func (d dashboard) variableValues() map[string]string {
	vals := map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
	for _, v := range d.Templating.List {
		vals[v.Name] = "value"
	}
	return vals
}

// grafanaVariable matches $name, ${name}, ${name:format} and [[name]].
var grafanaVariable = regexp.MustCompile(`\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]`)

func expandVariables(expr string, vals map[string]string) (string, error) {
	var unknown []string
	out := grafanaVariable.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVariable.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		v, ok := vals[name]
		if !ok {
			unknown = append(unknown, m)
		}
		return v
	})
	if unknown != nil {
		return "", fmt.Errorf("undefined Grafana variable %s", strings.Join(unknown, ", "))
	}
	return out, nil
}

// variableFunc matches the Prometheus data source's variable functions
// whose argument is PromQL.
var (
	labelValuesFunc = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*[A-Za-z_]\w*\s*\)\s*$`)
	queryResultFunc = regexp.MustCompile(`^\s*query_result\(\s*(.+)\s*\)\s*$`)
)

// promQL returns the PromQL inside a variable query.
func promQLOfVariable(text string) (string, error) {
	for _, re := range []*regexp.Regexp{labelValuesFunc, queryResultFunc} {
		if m := re.FindStringSubmatch(text); m != nil {
			return m[1], nil
		}
	}
	return "", fmt.Errorf("%q is not label_values(<selector>, <label>) or query_result(<query>): no metric to check", text)
}

// checkQuery parses q and returns one error for each thing wrong with it:
// it does not parse, or it selects a series name no program exports, or a
// selector names no metric at all (which nothing could check).
func checkQuery(q query, vals map[string]string, known catalog) []error {
	wrap := func(err error) error { return fmt.Errorf("%s: %w\n\tquery: %s", q.where, err, q.expr) }
	text, err := expandVariables(q.expr, vals)
	if err != nil {
		return []error{wrap(err)}
	}
	if q.variableQuery {
		if text, err = promQLOfVariable(text); err != nil {
			return []error{wrap(err)}
		}
	}
	if strings.TrimSpace(text) == "" {
		return []error{wrap(errors.New("empty query"))}
	}
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(text)
	if err != nil {
		return []error{wrap(fmt.Errorf("PromQL does not parse: %w", err))}
	}
	var errs []error
	for _, name := range selectedNames(expr, &errs) {
		if _, ok := known[name]; !ok {
			errs = append(errs, fmt.Errorf("metric %s is exported by neither the extender nor the device plugin", name))
		}
	}
	for i := range errs {
		errs[i] = wrap(errs[i])
	}
	return errs
}

// selectedNames returns the metric name of every selector in expr, adding
// an error to errs for each selector without an exact name.
func selectedNames(expr parser.Expr, errs *[]error) []string {
	var names []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if name := metricName(vs); name != "" {
			names = append(names, name)
		} else {
			*errs = append(*errs, fmt.Errorf("selector %s names no exact metric", vs))
		}
		return nil
	})
	return names
}

func metricName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// checkDashboard runs checkQuery on every query of the dashboard in data.
func checkDashboard(t *testing.T, data []byte, known catalog) []error {
	t.Helper()
	d := loadDashboard(t, data)
	qs, err := d.queries()
	if err != nil {
		return []error{err}
	}
	if len(qs) == 0 {
		return []error{errors.New("the dashboard has no queries")}
	}
	vals := d.variableValues()
	var errs []error
	for _, q := range qs {
		errs = append(errs, checkQuery(q, vals, known)...)
	}
	return errs
}

func mustCatalog(t *testing.T) catalog {
	t.Helper()
	known, err := exported()
	if err != nil {
		t.Fatalf("gathering the programs' metrics: %v", err)
	}
	return known
}

// TestQueriesSelectExportedMetrics is the check itself.
func TestQueriesSelectExportedMetrics(t *testing.T) {
	known := mustCatalog(t)
	data := readDashboard(t)
	for _, err := range checkDashboard(t, data, known) {
		t.Error(err)
	}
	logUnused(t, data, known)
}

// logUnused names the programs' gpushare_ metrics no panel shows, so a new
// metric is a prompt to add a panel, not a failure. A histogram counts as
// shown when any of its series is.
func logUnused(t *testing.T, data []byte, known catalog) {
	var unused []string
	for name := range known {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(name, "gpushare_") && !strings.Contains(string(data), base) && !slices.Contains(unused, base) {
			unused = append(unused, base)
		}
	}
	slices.Sort(unused)
	if unused != nil {
		t.Logf("exported but on no panel: %s", strings.Join(unused, ", "))
	}
}

// TestRenamedMetricIsReported proves the check would catch a rename: the
// same dashboard with one metric spelled as it might be after a rename
// must fail, naming the metric.
func TestRenamedMetricIsReported(t *testing.T) {
	known := mustCatalog(t)
	const name, renamed = "gpushare_plugin_allocate_total", "gpushare_plugin_allocations_total"
	data := readDashboard(t)
	if !strings.Contains(string(data), name) {
		t.Fatalf("the dashboard no longer uses %s; pick another metric for this test", name)
	}
	mutated := strings.ReplaceAll(string(data), name, renamed)
	errs := checkDashboard(t, []byte(mutated), known)
	if len(errs) == 0 {
		t.Fatalf("renaming %s to %s in the dashboard was not reported", name, renamed)
	}
	for _, err := range errs {
		if !strings.Contains(err.Error(), "metric "+renamed+" is exported by neither") {
			t.Errorf("unexpected error: %v", err)
		}
	}
}

// TestBadQueriesAreReported covers each way a query can be wrong.
func TestBadQueriesAreReported(t *testing.T) {
	known := mustCatalog(t)
	vals := map[string]string{"__rate_interval": "5m", "node": "value"}
	for _, tc := range []struct {
		name, expr, want string
		variable         bool
	}{
		{"unknown metric", `sum(rate(gpushare_extender_no_such_thing_total[$__rate_interval]))`, "metric gpushare_extender_no_such_thing_total is exported by neither", false},
		{"histogram without suffix", `gpushare_extender_request_duration_seconds`, "metric gpushare_extender_request_duration_seconds is exported by neither", false},
		{"not PromQL", `sum(rate(gpushare_extender_binds_total[5m])`, "PromQL does not parse", false},
		{"undefined variable", `gpushare_extender_gpu_healthy{node=~"$gpu"}`, "undefined Grafana variable $gpu", false},
		{"no metric name", `{node="n1"}`, "names no exact metric", false},
		{"regex metric name", `{__name__=~"gpushare_.*"}`, "names no exact metric", false},
		{"variable of an unknown metric", `label_values(gpushare_extender_gpu_totl_units, node)`, "metric gpushare_extender_gpu_totl_units is exported by neither", true},
		{"variable without a metric", `label_values(node)`, "no metric to check", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := checkQuery(query{where: tc.name, expr: tc.expr, variableQuery: tc.variable}, vals, known)
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
				t.Errorf("errors %v, want one containing %q", errs, tc.want)
			}
		})
	}
}

// TestCatalogHasEachKind guards the check against a catalog that lost a
// program or a kind of series (a setup that no longer produces them would
// make every query of it fail, but this says why).
func TestCatalogHasEachKind(t *testing.T) {
	known := mustCatalog(t)
	for _, name := range []string{
		"gpushare_extender_request_duration_seconds_bucket", // histogram suffixes
		"gpushare_extender_leader",                          // app.Run's own registry
		"gpushare_extender_node_allocated_units",            // -gpu-metrics=node
		"gpushare_plugin_allocate_total",                    // the device plugin
	} {
		if _, ok := known[name]; !ok {
			t.Errorf("catalog lacks %s", name)
		}
	}
}

// TestDashboardShape checks what Grafana needs to import the dashboard
// anywhere: every query on the ${datasource} variable, which is a
// Prometheus data source variable, unique panel ids, and panels that query.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t, readDashboard(t))
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: datasource references as objects need 36 or later", d.SchemaVersion)
	}
	checkDatasourceVariable(t, d)
	ids := map[int]string{}
	for _, p := range allPanels(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
		// Grafana's grid is 24 columns; a wider panel is silently squeezed.
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		checkPanelDatasources(t, p)
	}
}

func checkDatasourceVariable(t *testing.T, d dashboard) {
	t.Helper()
	for _, v := range d.Templating.List {
		if v.Name == "datasource" {
			if q, err := variableQueryText(v.Query); v.Type != "datasource" || err != nil || q != "prometheus" {
				t.Errorf("variable datasource: type %q query %s, want a datasource variable of prometheus", v.Type, v.Query)
			}
			return
		}
	}
	t.Error("no datasource variable")
}

func checkPanelDatasources(t *testing.T, p panel) {
	t.Helper()
	if p.Type == "row" {
		return
	}
	if len(p.Targets) == 0 {
		t.Errorf("panel %q has no query", p.Title)
	}
	refs := []*datasourceRef{p.Datasource}
	for _, tg := range p.Targets {
		refs = append(refs, tg.Datasource)
	}
	for _, ref := range refs {
		if ref == nil || ref.Type != "prometheus" || ref.UID != promDatasource {
			t.Errorf("panel %q: datasource %+v, want {prometheus %s}", p.Title, ref, promDatasource)
		}
	}
}
