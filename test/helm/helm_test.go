package helm

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

var update = flag.Bool("update", false, "rewrite "+E2EFile+" from the chart")

// The release the tests render: kube-system, where manifests/base puts everything, and the
// Kubernetes version the test bed runs.
const (
	releaseName = "gpushare"
	namespace   = "kube-system"
	kubeVersion = "v1.37.2"
)

// E2EFile is the chart rendered with E2EValues, which test/e2e's TestHelmChart applies to the test
// bed (that module has no Helm; TestE2EFileUpToDate keeps the file in step with the chart).
const E2EFile = "testdata/e2e.yaml"

// E2EValues: the second scheduler (its ConfigMap is what the e2e test runs kube-scheduler with)
// and the device plugin's metrics.
var E2EValues = map[string]any{
	"scheduler": map[string]any{"mode": "secondScheduler"},
	"metrics":   map[string]any{"devicePlugin": true},
}

func chartDir(t *testing.T) string {
	t.Helper()
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "helm", "gpushare")
}

// render is `helm template` through Helm's SDK: a client-only dry-run install, whose release
// manifest is the rendered objects.
func render(t *testing.T, vals map[string]any) (string, error) {
	t.Helper()
	rel, err := renderRelease(t, vals)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// renderRelease is render's whole release: its manifest and the NOTES.txt it prints.
func renderRelease(t *testing.T, vals map[string]any) (*release.Release, error) {
	t.Helper()
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true // no release store to check the name against
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.KubeVersion = kv
	r, err := install.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		t.Fatalf("release of type %T", r)
	}
	return rel, nil
}

// objects reads a rendered manifest with the repository's own reader, the one manifests.Load
// reads the kustomize files with, so both sides are decoded the same way.
func objects(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func renderObjects(t *testing.T, vals map[string]any) []*unstructured.Unstructured {
	t.Helper()
	m, err := render(t, vals)
	if err != nil {
		t.Fatalf("render %v: %v", vals, err)
	}
	return objects(t, m)
}

// load reads kustomizations of manifests/ (relative directories) as `kubectl apply -k` would.
func load(t *testing.T, dirs ...string) []*unstructured.Unstructured {
	t.Helper()
	root, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	var all []*unstructured.Unstructured
	for _, d := range dirs {
		objs, err := manifests.Load(filepath.Join(root, d))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, objs...)
	}
	return all
}

func key(o *unstructured.Unstructured) string {
	return o.GetAPIVersion() + " " + manifests.Describe(o)
}

// sameObjects compares two object sets by identity (apiVersion, kind, namespace, name) and then
// each object's whole content; order is left out, since Helm sorts objects by kind and kustomize
// keeps the files' order, and the API server does not care. Nothing is stripped: the chart adds no
// labels of its own (no helm.sh/chart, no release labels), so any difference is a real one.
func sameObjects(t *testing.T, got, want []*unstructured.Unstructured) {
	t.Helper()
	index := func(objs []*unstructured.Unstructured) map[string]map[string]any {
		m := map[string]map[string]any{}
		for _, o := range objs {
			if _, dup := m[key(o)]; dup {
				t.Errorf("%s twice", key(o))
			}
			m[key(o)] = o.Object
		}
		return m
	}
	g, w := index(got), index(want)
	for k := range w {
		if _, ok := g[k]; !ok {
			t.Errorf("chart lacks %s", k)
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			t.Errorf("chart renders %s, which kustomize has not", k)
		}
	}
	for k, wo := range w {
		if gobj, ok := g[k]; ok {
			if d := cmp.Diff(wo, gobj); d != "" {
				t.Errorf("%s differs from kustomize (-kustomize +chart):\n%s", k, d)
			}
		}
	}
}

// overlays: each option of the chart and the kustomizations that install the same thing.
var overlays = []struct {
	name   string
	values map[string]any
	dirs   []string
}{
	{"default", nil, []string{"."}},
	{"nodeport", map[string]any{"extender": map[string]any{"service": map[string]any{"type": "NodePort"}}}, []string{"nodeport"}},
	{"mtls", map[string]any{"tls": map[string]any{"enabled": true}}, []string{"mtls"}},
	{"isolation-mps", map[string]any{"devicePlugin": map[string]any{"isolation": "mps"}}, []string{"isolation-mps"}},
	{"isolation-hami-core", map[string]any{"devicePlugin": map[string]any{"isolation": "hami-core"}}, []string{"isolation-hami-core"}},
	{"second-scheduler", map[string]any{"scheduler": map[string]any{"mode": "secondScheduler"}}, []string{".", "second-scheduler"}},
	{"scheduler-plugin", map[string]any{"scheduler": map[string]any{"mode": "schedulerPlugin"}}, []string{".", "scheduler-plugin"}},
	{"dra", map[string]any{"dra": map[string]any{"enabled": true}}, []string{".", "dra"}},
	{"usage", map[string]any{"devicePlugin": map[string]any{"usage": map[string]any{"enabled": true}}}, []string{"usage"}},
	{"dra-usage", map[string]any{"dra": map[string]any{"enabled": true, "usage": map[string]any{"enabled": true}}}, []string{".", "dra/usage"}},
}

// TestTemplateMatchesKustomize: the chart with default values renders exactly manifests/base, and
// with each overlay's option exactly what that overlay (plus manifests/ for the schedulers and the
// DRA mode, which are applied after it) installs.
func TestTemplateMatchesKustomize(t *testing.T) {
	for _, o := range overlays {
		t.Run(o.name, func(t *testing.T) {
			sameObjects(t, renderObjects(t, o.values), load(t, o.dirs...))
		})
	}
}

// withMetrics: every option that has no overlay, at once.
var withMetrics = map[string]any{
	"metrics": map[string]any{
		"devicePlugin":   true,
		"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}},
	},
}

// TestLint is `helm lint --strict` with the default values and with each option set: no warning
// and no error (INFO messages, such as the missing icon, are allowed).
func TestLint(t *testing.T) {
	cases := map[string]map[string]any{"metrics": withMetrics, "e2e": E2EValues}
	for _, o := range overlays {
		cases[o.name] = o.values
	}
	cases["dra options"] = draOptions()
	cases["tls+serviceMonitor"] = map[string]any{
		"tls": map[string]any{"enabled": true},
		"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true,
			"tlsConfig": map[string]any{"serverName": "gpushare-scheduler-extender.kube-system.svc"}}},
	}
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range cases {
		t.Run(name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = namespace
			lint.KubeVersion = kv
			res := lint.Run([]string{chartDir(t)}, vals)
			if res.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts, want 1", res.TotalChartsLinted)
			}
			for _, e := range res.Errors {
				t.Errorf("lint: %v", e)
			}
			for _, m := range res.Messages {
				t.Logf("lint: %v", m)
			}
		})
	}
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

func container(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s: %d containers", manifests.Describe(o), len(cs))
	}
	return cs[0].(map[string]any)
}

func args(t *testing.T, o *unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, o)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

// draOptions: the DRA mode with its options away from the defaults. A function, not a shared map:
// Helm deletes the null it is given from the caller's values as it coalesces them.
func draOptions() map[string]any {
	return map[string]any{
		"dra": map[string]any{
			"enabled":            true,
			"deviceListStrategy": "cdi-cri",
			"admissionPolicy":    false,
			"nodeSelector":       map[string]any{"gpu": "dra", "gpushare.io/dra": nil},
			"extraArgs":          []any{"--isolation-probe-interval=1m"},
		},
		"devicePlugin": map[string]any{"memoryUnit": "256MiB", "runtimeClassName": "nvidia"},
	}
}

// TestOptions covers the values no overlay stands for: images, memory unit, metrics and the
// ServiceMonitors, node selection, the DRA driver's options; and that ServiceMonitors and the DRA
// objects appear only when asked for.
func TestOptions(t *testing.T) {
	t.Run("no ServiceMonitor by default", func(t *testing.T) {
		for _, o := range renderObjects(t, map[string]any{"metrics": map[string]any{"devicePlugin": true}}) {
			if o.GetAPIVersion() == "monitoring.coreos.com/v1" {
				t.Errorf("%s rendered without metrics.serviceMonitor.enabled", key(o))
			}
		}
	})
	t.Run("no DRA by default", func(t *testing.T) {
		for _, o := range renderObjects(t, nil) {
			if o.GetAPIVersion() == "resource.k8s.io/v1" || o.GetName() == "gpushare-dra-driver" || o.GetName() == "gpushare-webhook" {
				t.Errorf("%s rendered without dra.enabled", key(o))
			}
		}
	})
	t.Run("dra", func(t *testing.T) {
		objs := renderObjects(t, draOptions())
		ds := find(t, objs, "DaemonSet", "gpushare-dra-driver")
		want := []string{"--mode=dra", "--memory-unit=256MiB", "--log-level=info", "--device-list-strategy=cdi-cri", "--isolation-probe-interval=1m"}
		if d := cmp.Diff(want, args(t, ds)); d != "" {
			t.Errorf("driver args (-want +got):\n%s", d)
		}
		spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
		if d := cmp.Diff(map[string]any{"gpu": "dra"}, spec["nodeSelector"]); d != "" {
			t.Errorf("nodeSelector: %s", d)
		}
		if spec["runtimeClassName"] != "nvidia" {
			t.Errorf("runtimeClassName %v, want nvidia", spec["runtimeClassName"])
		}
		find(t, objs, "DeviceClass", "gpu-mem.gpushare.io")
		for _, o := range objs {
			if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") && o.GetName() == "gpushare-dra-driver" {
				t.Errorf("%s rendered with dra.admissionPolicy=false", key(o))
			}
		}
		// The device plugin's DaemonSet stays: nodes pick their mode by label.
		find(t, objs, "DaemonSet", "gpushare-device-plugin")
	})
	t.Run("dra webhook", func(t *testing.T) {
		vals := draOptions()
		vals["images"] = map[string]any{"webhook": map[string]any{"repository": "my.registry/wh", "tag": "v3"}}
		vals["dra"].(map[string]any)["webhook"] = map[string]any{
			"replicas":          3,
			"failurePolicy":     "Ignore",
			"namespaceSelector": map[string]any{"matchLabels": nil, "matchExpressions": []any{map[string]any{"key": "team", "operator": "In", "values": []any{"ml"}}}},
			"templateGrace":     "1h",
			"tlsSecretName":     "wh-tls",
			"caBundle":          "Q0E=",
			"extraArgs":         []any{"--sweep-interval=30s"},
		}
		objs := renderObjects(t, vals)
		dep := find(t, objs, "Deployment", "gpushare-webhook")
		want := []string{"-listen=:8443", "-tls-cert-file=/tls/tls.crt", "-tls-key-file=/tls/tls.key", "-memory-unit=256MiB", "-template-grace=1h", "-log-level=info", "--sweep-interval=30s"}
		if d := cmp.Diff(want, args(t, dep)); d != "" {
			t.Errorf("webhook args (-want +got):\n%s", d)
		}
		if img := container(t, dep)["image"]; img != "my.registry/wh:v3" {
			t.Errorf("webhook image %v", img)
		}
		if n, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas"); fmt.Sprint(n) != "3" {
			t.Errorf("replicas %v, want 3", n)
		}
		vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
		if name, _, _ := unstructured.NestedString(vols[0].(map[string]any), "secret", "secretName"); name != "wh-tls" {
			t.Errorf("TLS Secret %q, want wh-tls", name)
		}
		mwc := find(t, objs, "MutatingWebhookConfiguration", "gpushare-webhook")
		hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
		hook := hooks[0].(map[string]any)
		if hook["failurePolicy"] != "Ignore" {
			t.Errorf("failurePolicy %v", hook["failurePolicy"])
		}
		if ca, _, _ := unstructured.NestedString(hook, "clientConfig", "caBundle"); ca != "Q0E=" {
			t.Errorf("caBundle %q", ca)
		}
		if _, ok := mwc.GetAnnotations()["cert-manager.io/inject-ca-from"]; ok {
			t.Error("cert-manager's injection annotation set beside a caBundle: the injector would overwrite it")
		}
		wantSel := map[string]any{"matchExpressions": []any{map[string]any{"key": "team", "operator": "In", "values": []any{"ml"}}}}
		if d := cmp.Diff(wantSel, hook["namespaceSelector"]); d != "" {
			t.Errorf("namespaceSelector (-want +got):\n%s", d)
		}

		vals = draOptions()
		vals["dra"].(map[string]any)["webhook"] = map[string]any{"enabled": false}
		for _, o := range renderObjects(t, vals) {
			if o.GetName() == "gpushare-webhook" {
				t.Errorf("%s rendered with dra.webhook.enabled=false", key(o))
			}
		}
	})
	t.Run("metrics", func(t *testing.T) {
		objs := renderObjects(t, withMetrics)
		ds := find(t, objs, "DaemonSet", "gpushare-device-plugin")
		if a := args(t, ds); !slices.Contains(a, "--metrics-listen=:9400") {
			t.Errorf("plugin args %q lack --metrics-listen=:9400", a)
		}
		ports, _, _ := unstructured.NestedSlice(container(t, ds), "ports")
		if len(ports) != 1 || ports[0].(map[string]any)["name"] != "metrics" {
			t.Errorf("plugin ports %v, want one named metrics", ports)
		}
		for _, name := range []string{"gpushare-scheduler-extender", "gpushare-device-plugin"} {
			sm := find(t, objs, "ServiceMonitor", name)
			if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetNamespace() != namespace || sm.GetLabels()["release"] != "prom" {
				t.Errorf("ServiceMonitor %s: %s, namespace %s, labels %v", name, sm.GetAPIVersion(), sm.GetNamespace(), sm.GetLabels())
			}
			sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
			svc := find(t, objs, "Service", map[string]string{"gpushare-scheduler-extender": "gpushare-scheduler-extender", "gpushare-device-plugin": "gpushare-device-plugin-metrics"}[name])
			if svcLabels := svc.GetLabels(); svcLabels["app.kubernetes.io/name"] != sel["app.kubernetes.io/name"] {
				t.Errorf("ServiceMonitor %s selects %v; its Service is labelled %v", name, sel, svcLabels)
			}
		}
	})
	// The control plane is the one thing the chart cannot install: the notes say how, per mode.
	t.Run("notes", func(t *testing.T) {
		for _, c := range []struct {
			vals map[string]any
			want string
		}{
			{nil, "manifests/scheduler/kube-scheduler-config.yaml"},
			{map[string]any{"tls": map[string]any{"enabled": true}}, "manifests/mtls/kube-scheduler-config.yaml"},
			{map[string]any{"extender": map[string]any{"service": map[string]any{"type": "NodePort"}}}, "http://127.0.0.1:32766/gpushare-scheduler"},
			{map[string]any{"scheduler": map[string]any{"mode": "secondScheduler"}}, "schedulerName: gpushare-scheduler"},
			{map[string]any{"scheduler": map[string]any{"mode": "schedulerPlugin"}}, "schedulerName: gpushare-scheduler"},
			{map[string]any{"dra": map[string]any{"enabled": true}}, "kubectl label node <gpu-node> gpushare.io/dra=true"},
			{map[string]any{"dra": map[string]any{"enabled": true}}, "kubectl label namespace <namespace> gpushare.io/dra=true"},
			{map[string]any{"dra": map[string]any{"enabled": true}}, "gen-webhook-cert.sh <dir> --namespace kube-system"},
		} {
			rel, err := renderRelease(t, c.vals)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(rel.Info.Notes, c.want) {
				t.Errorf("notes with %v lack %q:\n%s", c.vals, c.want, rel.Info.Notes)
			}
		}
	})
	t.Run("images, unit, nodes", func(t *testing.T) {
		objs := renderObjects(t, map[string]any{
			"images": map[string]any{
				"devicePlugin": map[string]any{"repository": "my.registry/dp", "tag": "v1"},
				"extender":     map[string]any{"repository": "my.registry/ext", "tag": "v2"},
			},
			"devicePlugin": map[string]any{
				"memoryUnit": "256MiB",
				// Helm merges maps with the defaults: null removes the default label.
				"nodeSelector": map[string]any{"gpu": "shared", "gpushare": nil},
				"tolerations":  []any{map[string]any{"key": "gpu", "operator": "Exists"}},
			},
		})
		ds := find(t, objs, "DaemonSet", "gpushare-device-plugin")
		ext := find(t, objs, "Deployment", "gpushare-scheduler-extender")
		if img := container(t, ds)["image"]; img != "my.registry/dp:v1" {
			t.Errorf("plugin image %v", img)
		}
		if img := container(t, ext)["image"]; img != "my.registry/ext:v2" {
			t.Errorf("extender image %v", img)
		}
		if a := args(t, ds); a[0] != "--memory-unit=256MiB" {
			t.Errorf("plugin args %q", a)
		}
		spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
		if d := cmp.Diff(map[string]any{"gpu": "shared"}, spec["nodeSelector"]); d != "" {
			t.Errorf("nodeSelector: %s", d)
		}
		if d := cmp.Diff([]any{map[string]any{"key": "gpu", "operator": "Exists"}}, spec["tolerations"]); d != "" {
			t.Errorf("tolerations: %s", d)
		}
	})
}

// TestRefused: values.schema.json and the chart's checks refuse what would install something
// broken, before anything renders.
func TestRefused(t *testing.T) {
	for name, c := range map[string]struct {
		vals map[string]any
		want string
	}{
		"unknown isolation":        {map[string]any{"devicePlugin": map[string]any{"isolation": "mig"}}, "isolation"},
		"unknown mode":             {map[string]any{"scheduler": map[string]any{"mode": "default"}}, "mode"},
		"misspelt value":           {map[string]any{"tls": map[string]any{"enable": true}}, "enable"},
		"bad unit":                 {map[string]any{"devicePlugin": map[string]any{"memoryUnit": "GB"}}, "memoryUnit"},
		"dra volume-mounts":        {map[string]any{"dra": map[string]any{"enabled": true, "deviceListStrategy": "volume-mounts"}}, "deviceListStrategy"},
		"webhook failure policy":   {map[string]any{"dra": map[string]any{"enabled": true, "webhook": map[string]any{"failurePolicy": "Open"}}}, "failurePolicy"},
		"webhook grace":            {map[string]any{"dra": map[string]any{"enabled": true, "webhook": map[string]any{"templateGrace": "ten minutes"}}}, "templateGrace"},
		"tls with second schedule": {map[string]any{"tls": map[string]any{"enabled": true}, "scheduler": map[string]any{"mode": "secondScheduler"}}, "tls.enabled needs scheduler.mode=extender"},
		"tls monitor without cert": {map[string]any{"tls": map[string]any{"enabled": true}, "metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}}, "tlsConfig"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render(t, c.vals)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("render: %v; want an error naming %q", err, c.want)
			}
		})
	}
}

// TestE2EFileUpToDate: testdata/e2e.yaml is the chart rendered with E2EValues (go test -update
// rewrites it), so test/e2e installs what the chart renders today.
func TestE2EFileUpToDate(t *testing.T) {
	m, err := render(t, E2EValues)
	if err != nil {
		t.Fatal(err)
	}
	header := "# Generated by test/helm (go test -update): the gpushare chart rendered with scheduler.mode=secondScheduler\n" +
		"# and metrics.devicePlugin=true, release " + releaseName + " in " + namespace + ". test/e2e's TestHelmChart applies it.\n"
	want := []byte(header + m)
	if *update {
		if err := os.WriteFile(E2EFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(E2EFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not the chart's rendering: run go test -run TestE2EFileUpToDate -update in test/helm", E2EFile)
	}
}
