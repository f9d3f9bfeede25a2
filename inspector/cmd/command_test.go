package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/inspector/render"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// staticConfig is a ConfigGetter over an in-memory kubeconfig, with -n given as namespace.
type staticConfig struct{ namespace string }

func (s staticConfig) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["ctx"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "ctx"
	overrides := &clientcmd.ConfigOverrides{}
	overrides.Context.Namespace = s.namespace
	return clientcmd.NewDefaultClientConfig(*cfg, overrides)
}

func (s staticConfig) ToRESTConfig() (*rest.Config, error) {
	return s.ToRawKubeConfigLoader().ClientConfig()
}

// run executes the command against a fake clientset holding objs.
func run(t *testing.T, getter ConfigGetter, args []string, objs ...runtime.Object) (code int, stdout, stderr string, client *fake.Clientset) {
	t.Helper()
	client = fake.NewClientset(objs...)
	code, stdout, stderr = runOn(t, client, getter, args)
	return code, stdout, stderr, client
}

// runOn executes the command against client.
func runOn(t *testing.T, client *fake.Clientset, getter ConfigGetter, args []string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	newClient := func(cfg *rest.Config) (kubernetes.Interface, error) {
		if cfg.ContentType != runtime.ContentTypeProtobuf {
			t.Errorf("content type %q, want protobuf", cfg.ContentType)
		}
		return client, nil
	}
	code = Execute(context.Background(), args, Streams{Out: &out, ErrOut: &errOut}, getter, newClient)
	return code, out.String(), errOut.String()
}

// contractObjects is the contract's first summary sample as API objects.
func contractObjects() []runtime.Object {
	b, c := "cn-shanghai.i-uf61h64dz1tmlob9hmtb", "cn-shanghai.i-uf61h64dz1tmlob9hmtc"
	nodes := []corev1.Node{fixture.Node(b, "192.168.0.71", 15, 1), fixture.Node(c, "192.168.0.70", 15, 1), fixture.Node("cpu", "10.9.9.9", 0, 0)}
	pods := []corev1.Pod{
		fixture.SimplePod("default", "binpack-1-0", b, 3, 0, 15, true),
		fixture.SimplePod("default", "binpack-1-1", b, 3, 0, 15, true),
		fixture.SimplePod("other", "binpack-1-2", c, 3, 0, 15, true),
	}
	var objs []runtime.Object
	for i := range nodes {
		objs = append(objs, &nodes[i])
	}
	for i := range pods {
		objs = append(objs, &pods[i])
	}
	return objs
}

// expected renders what the command must print for objs.
func expected(t *testing.T, details bool, objs []runtime.Object) string {
	t.Helper()
	var in collect.Objects
	for _, o := range objs {
		switch x := o.(type) {
		case *corev1.Node:
			in.Nodes = append(in.Nodes, *x)
		case *corev1.Pod:
			in.Pods = append(in.Pods, *x)
		case *resourceapi.ResourceSlice:
			in.Slices = append(in.Slices, *x)
		case *resourceapi.ResourceClaim:
			in.Claims = append(in.Claims, *x)
		}
	}
	var b bytes.Buffer
	f := render.Summary
	if details {
		f = render.Details
	}
	if err := f(&b, collect.BuildObjects(in)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// verbs lists the API calls made, as "verb resource [fieldSelector]".
func verbs(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		s := a.GetVerb() + " " + a.GetResource().Resource
		if l, ok := a.(k8stesting.ListActionImpl); ok {
			if fs := l.GetListRestrictions().Fields.String(); fs != "" {
				s += " " + fs
			}
		}
		out = append(out, s)
	}
	return out
}

func TestSummaryOneListEach(t *testing.T) {
	objs := contractObjects()
	code, out, errOut, client := run(t, staticConfig{}, nil, objs...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if want := expected(t, false, objs); out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	got := verbs(client)
	// No slice of our driver: no claim LIST.
	want := []string{"list nodes", "list resourceslices spec.driver=gpu-mem.gpushare.io", "list pods status.phase!=Failed,status.phase!=Succeeded"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("API calls %q, want %q", got, want)
	}
}

func TestOneNodeIsNodeScoped(t *testing.T) {
	objs := contractObjects()
	node := "cn-shanghai.i-uf61h64dz1tmlob9hmtb"
	code, out, errOut, client := run(t, staticConfig{}, []string{"-d", node}, objs...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if !strings.Contains(out, "NAME:       "+node+"\n") || strings.Contains(out, "hmtc") {
		t.Errorf("details of one node:\n%s", out)
	}
	got := verbs(client)
	want := []string{"get nodes", "list resourceslices spec.driver=gpu-mem.gpushare.io,spec.nodeName=" + node,
		"list pods spec.nodeName=" + node + ",status.phase!=Failed,status.phase!=Succeeded"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("API calls %q, want %q", got, want)
	}
}

func TestErrorsExitOneWithAdvice(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("KUBECONFIG", filepath.Join(home, "missing"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	cpuOnly := fixture.Node("cpu", "10.0.0.1", 0, 0)
	cases := []struct {
		name   string
		getter ConfigGetter
		args   []string
		objs   []runtime.Object
		want   string
	}{
		{"missing node", staticConfig{}, []string{"nope"}, contractObjects(), `error: node "nope" not found: run kubectl inspect gpushare to list`},
		{"not a sharing node", staticConfig{}, []string{"cpu"}, contractObjects(), `error: node "cpu" is not a GPU-sharing node`},
		{"no sharing nodes", staticConfig{}, nil, []runtime.Object{&cpuOnly}, "error: no GPU-sharing nodes found"},
		{"bad output", staticConfig{}, []string{"-o", "xml"}, contractObjects(), `error: unknown output format "xml"`},
		{"two nodes", staticConfig{}, []string{"a", "b"}, nil, "error: accepts at most 1 arg"},
		{"no kubeconfig", NewKubeFlags(), nil, nil, "error: no kubeconfig found: set KUBECONFIG, pass --kubeconfig FILE"},
		{"kubeconfig file missing", NewKubeFlags(), []string{"--kubeconfig", filepath.Join(home, "nope")}, nil, "error: load kubeconfig:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut, _ := run(t, tc.getter, tc.args, tc.objs...)
			if code != 1 || out != "" || !strings.HasPrefix(errOut, tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 1, no stdout, stderr starting %q", code, out, errOut, tc.want)
			}
		})
	}
}

func TestMalformedPodIsSkippedWithWarning(t *testing.T) {
	objs := contractObjects()
	bad := fixture.WithPodAnnotation(fixture.SimplePod("default", "broken", "cn-shanghai.i-uf61h64dz1tmlob9hmtc", 5, 0, 15, true),
		gpushare.AnnotationGPUIndex, "zero")
	objs = append(objs, &bad)
	code, out, errOut, _ := run(t, staticConfig{}, nil, objs...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if !strings.HasPrefix(errOut, "warning: skipped pod default/broken: ") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("stderr %q", errOut)
	}
	if want := expected(t, false, contractObjects()); out != want {
		t.Errorf("the broken pod changed the numbers:\n%s\nwant:\n%s", out, want)
	}
}

func TestNamespaceFiltersPodsNotTotals(t *testing.T) {
	objs := contractObjects()
	code, out, errOut, _ := run(t, staticConfig{namespace: "other"}, []string{"-o", "json"}, objs...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var r collect.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Allocated != 9 || r.Total != 30 {
		t.Errorf("totals %d/%d, want 9/30 whatever the namespace", r.Allocated, r.Total)
	}
	var names []string
	for _, n := range r.Nodes {
		for _, p := range n.Pods {
			names = append(names, p.Namespace+"/"+p.Name)
		}
	}
	if strings.Join(names, ",") != "other/binpack-1-2" {
		t.Errorf("pods %v, want only other/binpack-1-2", names)
	}
}

func TestYAMLAndDetails(t *testing.T) {
	objs := contractObjects()
	code, out, _, _ := run(t, staticConfig{}, []string{"--details"}, objs...)
	if code != 0 || out != expected(t, true, objs) {
		t.Errorf("details exit %d:\n%s", code, out)
	}
	code, out, _, _ = run(t, staticConfig{}, []string{"-o", "yaml"}, objs...)
	if code != 0 || !strings.HasPrefix(out, "allocated: 9\nallocatedPercent: 30\n") {
		t.Errorf("yaml exit %d:\n%s", code, out)
	}
}
