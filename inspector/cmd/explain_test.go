package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
)

// whyObjects: node a with 3 and 2 GiB free on its two GPUs, a pending 4 GiB pod.
func whyObjects() []runtime.Object {
	n := fixture.Node("a", "10.0.0.1", 16, 2)
	c := fixture.SimplePod("default", "c", "a", 5, 0, 8, true)
	d := fixture.SimplePod("default", "d", "a", 6, 1, 8, true)
	b := fixture.Pod("default", "b", "", fixture.Container("main", 4))
	b.Status.Phase = corev1.PodPending
	return []runtime.Object{&n, &c, &d, &b}
}

func runIn(t *testing.T, in string, args []string, objs ...runtime.Object) (int, string, string) {
	t.Helper()
	client := fake.NewClientset(objs...)
	var out, errOut bytes.Buffer
	newClient := func(*rest.Config) (kubernetes.Interface, error) { return client, nil }
	code := Execute(context.Background(), args, Streams{In: strings.NewReader(in), Out: &out, ErrOut: &errOut}, staticConfig{}, newClient)
	return code, out.String(), errOut.String()
}

func TestWhyExitsOneWhilePending(t *testing.T) {
	code, out, errOut := runIn(t, "", []string{"why", "b", "-o", "json"}, whyObjects()...)
	var w explain.Why
	if err := json.Unmarshal([]byte(out), &w); err != nil || code != 1 || errOut != "" {
		t.Fatalf("exit %d, %v, stderr %q", code, err, errOut)
	}
	if w.Nodes[0].Kind != explain.KindFragmented {
		t.Errorf("verdict %+v", w.Nodes[0])
	}
	if code, _, _ := runIn(t, "", []string{"why", "c"}, whyObjects()...); code != 0 {
		t.Errorf("bound pod: exit %d, want 0", code)
	}
}

func TestWhyFitErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		args []string
		want string
	}{
		{"", []string{"why", "nope"}, `error: pod "nope" not found in namespace "default" (use -n NAMESPACE)`},
		{"", []string{"why"}, "error: accepts 1 arg(s), received 0"},
		{"", []string{"why", "b", "--policy", "worst"}, "unknown placement policy"},
		{"", []string{"why", "b", "-o", "wide"}, "unknown output format"},
		{"", []string{"fit"}, `required flag(s) "filename" not set`},
		{"kind: Pod\nspec: [", []string{"fit", "-f", "-"}, "error: -: malformed YAML or JSON"},
		{"kind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: m}]}\n", []string{"fit", "-f", "-"}, "asks for no aliyun.com/gpu-mem"},
	} {
		code, _, errOut := runIn(t, tc.in, tc.args, whyObjects()...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestFitFromStdin(t *testing.T) {
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: small}\nspec: {containers: [{name: m, resources: {limits: {aliyun.com/gpu-mem: 2}}}]}\n"
	code, out, errOut := runIn(t, pod, []string{"fit", "-f", "-"}, whyObjects()...)
	if code != 0 || !strings.Contains(out, "would land on a, GPU 1") {
		t.Errorf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runIn(t, pod, []string{"fit", "-f", "-", "--replicas", "3"}, whyObjects()...)
	if code != 1 || !strings.Contains(out, "2 of 3 copies fit; copy 3 fits nowhere") {
		t.Errorf("replicas: exit %d\n%s", code, out)
	}
}
