package cmd

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
)

// draObjects is fixture.DRACluster as API objects; devicePluginOnly leaves
// the slices and claims out, the view the command falls back to.
func draObjects(devicePluginOnly bool) []runtime.Object {
	nodes, pods, slices, claims := fixture.DRACluster()
	var objs []runtime.Object
	for i := range nodes {
		objs = append(objs, &nodes[i])
	}
	for i := range pods {
		objs = append(objs, &pods[i])
	}
	if devicePluginOnly {
		return objs
	}
	for i := range slices {
		objs = append(objs, &slices[i])
	}
	for i := range claims {
		objs = append(objs, &claims[i])
	}
	return objs
}

// refuse makes every LIST of resource fail with err.
func refuse(client *fake.Clientset, resource string, err error) {
	client.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, err
	})
}

func TestDRAListsSlicesAndClaims(t *testing.T) {
	objs := draObjects(false)
	code, out, errOut, client := run(t, staticConfig{}, []string{"-d"}, objs...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if want := expected(t, true, objs); out != want || !strings.Contains(out, "MODE:       dra") {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	got := strings.Join(verbs(client), "|")
	want := "list nodes|list resourceslices spec.driver=gpu-mem.gpushare.io|list resourceclaims|list pods status.phase!=Failed,status.phase!=Succeeded"
	if got != want {
		t.Errorf("API calls %q, want %q", got, want)
	}
}

func TestDRAOneNodeIsNodeScoped(t *testing.T) {
	code, out, errOut, client := run(t, staticConfig{}, []string{"dra-0"}, draObjects(false)...)
	if code != 0 || errOut != "" || !strings.Contains(out, "\ndra-0  10.7.0.1   11/79 ") || strings.Contains(out, "dp-0") {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	got := strings.Join(verbs(client), "|")
	want := "get nodes|list resourceslices spec.driver=gpu-mem.gpushare.io,spec.nodeName=dra-0|list resourceclaims|" +
		"list pods spec.nodeName=dra-0,status.phase!=Failed,status.phase!=Succeeded"
	if got != want {
		t.Errorf("API calls %q, want %q", got, want)
	}
}

// An API server without resource.k8s.io/v1, or RBAC without the DRA rules,
// costs the DRA view only: the device-plugin view, exit 0, one warning.
func TestDRAUnreadableFallsBack(t *testing.T) {
	slices := schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}
	claims := schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}
	cases := []struct {
		name, resource string
		err            error
		want, hint     string
	}{
		{"slices forbidden", "resourceslices", apierrors.NewForbidden(slices, "", errors.New("RBAC")),
			"warning: DRA-mode nodes not shown: list resourceslices: resourceslices.resource.k8s.io is forbidden: RBAC",
			"(showing DRA-mode nodes needs list on resourceslices and resourceclaims (resource.k8s.io) in all namespaces)"},
		// What an API server without the group answers.
		{"not served", "resourceslices", apierrors.NewGenericServerResponse(404, "list", slices, "", "", 0, false),
			"warning: DRA-mode nodes not shown: list resourceslices: the server could not find the requested resource",
			"(the API server does not serve resource.k8s.io/v1; Kubernetes 1.34 and later do)"},
		{"claims forbidden", "resourceclaims", apierrors.NewForbidden(claims, "", errors.New("RBAC")),
			"warning: DRA-mode nodes not shown: list resourceclaims: resourceclaims.resource.k8s.io is forbidden: RBAC",
			"(showing DRA-mode nodes needs list"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(draObjects(false)...)
			refuse(client, tc.resource, tc.err)
			code, out, errOut := runOn(t, client, staticConfig{}, []string{"-d"})
			if code != 0 || !strings.HasPrefix(errOut, tc.want) || !strings.Contains(errOut, tc.hint) || strings.Count(errOut, "\n") != 1 {
				t.Errorf("exit %d, stderr %q; want exit 0 and one line starting %q, with %q", code, errOut, tc.want, tc.hint)
			}
			if want := expected(t, true, draObjects(true)); out != want {
				t.Errorf("stdout:\n%s\nwant the device-plugin view:\n%s", out, want)
			}
		})
	}
}

// A DRA node named on the command line needs its slice: unreadable, the
// error says so.
func TestDRANodeUnreadableIsNotSharing(t *testing.T) {
	client := fake.NewClientset(draObjects(false)...)
	refuse(client, "resourceslices", apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", errors.New("RBAC")))
	code, out, errOut := runOn(t, client, staticConfig{}, []string{"dra-0"})
	want := `error: node "dra-0" is not a GPU-sharing node: it has no allocatable aliyun.com/gpu-mem and no ResourceSlice of gpu-mem.gpushare.io`
	if code != 1 || out != "" || !strings.HasPrefix(errOut, want) || !strings.Contains(errOut, "(ResourceSlices could not be read: list resourceslices: ") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// -n keeps that namespace's claims and pods; totals count every namespace.
func TestDRANamespaceFiltersClaims(t *testing.T) {
	code, out, errOut, _ := run(t, staticConfig{namespace: "default"}, []string{"-o", "json"}, draObjects(false)...)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var r collect.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	dra := r.Nodes[1]
	if dra.Allocated != 134 || len(dra.Claims) != 1 || dra.Claims[0].Name != "tiny-gpu" || len(dra.Pods) != 1 || dra.Pods[0].Name != "tiny" {
		t.Errorf("DRA node %+v; want 134 allocated, only default's claim and pod", dra)
	}
}
