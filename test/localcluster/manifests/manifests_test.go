package manifests

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/podresources"
)

func loadT(t *testing.T, sub string) map[string]*unstructured.Unstructured {
	t.Helper()
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Load(filepath.Join(dir, sub))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if _, dup := out[Describe(o)]; dup {
			t.Fatalf("%s twice", Describe(o))
		}
		out[Describe(o)] = o
	}
	return out
}

func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	if o == nil {
		t.Fatal("object missing")
	}
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &v, true); err != nil {
		t.Fatalf("%s: %v", Describe(o), err)
	}
	return &v
}

// The shipped objects carry the contract's facts (docs/contract.md sections 4 and 6).
func TestInstallManifests(t *testing.T) {
	objs := loadT(t, ".")
	ds := convert[appsv1.DaemonSet](t, objs["DaemonSet kube-system/gpushare-device-plugin"])
	spec := ds.Spec.Template.Spec
	if spec.NodeSelector[gpushare.LabelGPUShare] != gpushare.LabelValueTrue {
		t.Errorf("device plugin nodeSelector %v, want %s=%s", spec.NodeSelector, gpushare.LabelGPUShare, gpushare.LabelValueTrue)
	}
	// The kubelet's device-plugin directory, and its pod-resources API read-only (the plugin checks
	// there whose container each Allocate went to).
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	c := spec.Containers[0]
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	if len(spec.Volumes) != 2 || hostPaths["device-plugin"] != gpushare.DevicePluginDir || hostPaths["pod-resources"] != path.Dir(podresources.DefaultSocket) {
		t.Errorf("device plugin volumes %+v, want hostPaths %s and %s", spec.Volumes, gpushare.DevicePluginDir, path.Dir(podresources.DefaultSocket))
	}
	if m := mounts["device-plugin"]; len(mounts) != 2 || m.MountPath != gpushare.DevicePluginDir || m.ReadOnly {
		t.Errorf("device plugin mounts %+v, want %s read-write", c.VolumeMounts, gpushare.DevicePluginDir)
	}
	if m := mounts["pod-resources"]; m.MountPath != path.Dir(podresources.DefaultSocket) || !m.ReadOnly {
		t.Errorf("device plugin mounts %+v, want %s read-only", c.VolumeMounts, path.Dir(podresources.DefaultSocket))
	}
	var nodeName bool
	for _, e := range c.Env {
		nodeName = nodeName || (e.Name == gpushare.EnvNodeName && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName")
	}
	if !nodeName {
		t.Errorf("device plugin env %+v lacks %s from spec.nodeName", c.Env, gpushare.EnvNodeName)
	}
	if !strings.HasSuffix(c.Image, ":dev") {
		t.Errorf("device plugin image %q: the kustomization's newTag was not applied", c.Image)
	}
	if spec.ServiceAccountName != "gpushare-device-plugin" {
		t.Errorf("device plugin ServiceAccount %q", spec.ServiceAccountName)
	}

	svc := convert[corev1.Service](t, objs["Service kube-system/gpushare-scheduler-extender"])
	if p := svc.Spec.Ports; svc.Spec.Type != corev1.ServiceTypeClusterIP || len(p) != 1 || p[0].Port != 12345 || p[0].NodePort != 0 {
		t.Errorf("extender Service %s %+v, want ClusterIP port 12345 and no NodePort", svc.Spec.Type, p)
	}
	ext := convert[appsv1.Deployment](t, objs["Deployment kube-system/gpushare-scheduler-extender"])
	// Two replicas, one binder at a time by leader election; only the leader is ready, so a rollout
	// must not wait for a second ready replica.
	if ru := ext.Spec.Strategy.RollingUpdate; *ext.Spec.Replicas != 2 || ext.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
		ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "100%" {
		t.Errorf("extender Deployment: %d replicas, strategy %+v; want 2 and RollingUpdate with maxUnavailable 100%%", *ext.Spec.Replicas, ext.Spec.Strategy)
	}
	if args := ext.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--listen=:12345") || !slices.Contains(args, "--leader-elect") {
		t.Errorf("extender args %v, want --listen=:12345 and --leader-elect", args)
	}
	for _, name := range []string{"ClusterRoleBinding gpushare-device-plugin", "ClusterRoleBinding gpushare-scheduler-extender", "RoleBinding kube-system/gpushare-scheduler-extender"} {
		b := objs[name]
		if b == nil {
			t.Errorf("%s missing", name)
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		if len(subjects) != 1 || subjects[0].(map[string]any)["kind"] != rbacv1.ServiceAccountKind || subjects[0].(map[string]any)["namespace"] != "kube-system" {
			t.Errorf("%s subjects %v, want one kube-system ServiceAccount", name, subjects)
		}
	}
}

type schedulerConfig struct {
	LeaderElection struct {
		ResourceName string `json:"resourceName"`
	} `json:"leaderElection"`
	Profiles []struct {
		SchedulerName string `json:"schedulerName"`
	} `json:"profiles"`
	Extenders []extenderConfig `json:"extenders"`
}

func checkExtender(t *testing.T, what string, data []byte, port string) schedulerConfig {
	t.Helper()
	cfg := checkExtenderVerbs(t, what, data, port)
	if e := cfg.Extenders[0]; e.PrioritizeVerb != "prioritize" || e.Weight <= 0 {
		t.Errorf("%s: prioritize verb %q weight %d", what, e.PrioritizeVerb, e.Weight)
	}
	return cfg
}

// checkExtenderVerbs checks the extender entry of a configuration but for its prioritize verb.
func checkExtenderVerbs(t *testing.T, what string, data []byte, port string) schedulerConfig {
	t.Helper()
	var cfg schedulerConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(cfg.Extenders) != 1 {
		t.Fatalf("%s: %d extenders, want 1", what, len(cfg.Extenders))
	}
	e := cfg.Extenders[0]
	if !strings.HasSuffix(e.URLPrefix, ":"+port+"/gpushare-scheduler") {
		t.Errorf("%s: urlPrefix %q, want port %s and path /gpushare-scheduler", what, e.URLPrefix, port)
	}
	if e.FilterVerb != "filter" || e.BindVerb != "bind" || e.PreemptVerb != "preempt" {
		t.Errorf("%s: verbs %q %q %q", what, e.FilterVerb, e.BindVerb, e.PreemptVerb)
	}
	if !e.NodeCacheCapable || e.Ignorable || len(e.ManagedResources) != 1 || e.ManagedResources[0].Name != string(gpushare.ResourceName) {
		t.Errorf("%s: nodeCacheCapable %v ignorable %v managedResources %+v", what, e.NodeCacheCapable, e.Ignorable, e.ManagedResources)
	}
	// A bind may take the Binding's deadline plus the read-back of an unanswered one; the
	// scheduler must wait longer, or it gives up on binds that are still deciding.
	if need := binder.DefaultBindTimeout + binder.DefaultVerifyTimeout; e.HTTPTimeout == nil {
		t.Errorf("%s: no httpTimeout (the scheduler's default is 5s); want more than %v", what, need)
	} else if d, err := time.ParseDuration(*e.HTTPTimeout); err != nil || d <= need {
		t.Errorf("%s: httpTimeout %q (%v), want more than %v", what, *e.HTTPTimeout, err, need)
	}
	return cfg
}

func TestSchedulerConfigs(t *testing.T) {
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := SchedulerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkExtender(t, SchedulerConfigFile, data, "12345")
	exts, err := Extenders(data, "http://x/gpushare-scheduler", nil)
	if err != nil || len(exts) != 1 || !exts[0].NodeCacheCapable || exts[0].ManagedResources[0].Name != string(gpushare.ResourceName) {
		t.Errorf("Extenders: %+v, %v", exts, err)
	}

	second, err := SecondSchedulerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkExtender(t, "second scheduler", second, "12345")
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != SecondSchedulerName || cfg.LeaderElection.ResourceName != SecondSchedulerName {
		t.Errorf("second scheduler: profiles %+v, lease %q; want %s for both", cfg.Profiles, cfg.LeaderElection.ResourceName, SecondSchedulerName)
	}
	objs := loadT(t, SecondSchedulerDir)
	role := convert[rbacv1.Role](t, objs["Role kube-system/gpushare-scheduler-leader-election"])
	if !slices.Contains(role.Rules[0].ResourceNames, cfg.LeaderElection.ResourceName) {
		t.Errorf("leader-election Role names %v, the config's lease is %q", role.Rules[0].ResourceNames, cfg.LeaderElection.ResourceName)
	}
	d := convert[appsv1.Deployment](t, objs["Deployment kube-system/gpushare-scheduler"])
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "registry.k8s.io/kube-scheduler:v1.37.2" {
		t.Errorf("second scheduler image %q", img)
	}
}

// The measured profile without prioritize calls the extender to filter, bind and preempt only, and
// ranks nodes by MostAllocated on gpu-mem alone.
func TestMostAllocatedConfig(t *testing.T) {
	data, err := MostAllocatedConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkExtenderVerbs(t, "the MostAllocated configuration", data, "12345")
	if e := cfg.Extenders[0]; e.PrioritizeVerb != "" || e.Weight != 0 {
		t.Errorf("prioritize verb %q weight %d; want none", e.PrioritizeVerb, e.Weight)
	}
	profiles, err := Profiles(data, "x")
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		SchedulerName string `json:"schedulerName"`
		PluginConfig  []struct {
			Name string `json:"name"`
			Args struct {
				ScoringStrategy struct {
					Type      string `json:"type"`
					Resources []struct {
						Name   string `json:"name"`
						Weight int    `json:"weight"`
					} `json:"resources"`
				} `json:"scoringStrategy"`
			} `json:"args"`
		} `json:"pluginConfig"`
	}
	if err := json.Unmarshal(profiles, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].SchedulerName != "x" || len(got[0].PluginConfig) != 1 {
		t.Fatalf("profiles %+v; want one, renamed, with one plugin's config", got)
	}
	pc := got[0].PluginConfig[0]
	s := pc.Args.ScoringStrategy
	if pc.Name != "NodeResourcesFit" || s.Type != "MostAllocated" || len(s.Resources) != 1 ||
		s.Resources[0].Name != string(gpushare.ResourceName) || s.Resources[0].Weight != 1 {
		t.Errorf("plugin config %+v; want NodeResourcesFit MostAllocated on %s, weight 1", pc, gpushare.ResourceName)
	}
}

func TestSamples(t *testing.T) {
	objs := loadT(t, "samples")
	d := convert[appsv1.Deployment](t, objs["Deployment gpushare-sample"])
	pod := convert[corev1.Pod](t, objs["Pod gpushare-multi-container"])
	for _, spec := range []corev1.PodSpec{d.Spec.Template.Spec, pod.Spec} {
		if n, err := gpushare.PodRequest(&corev1.Pod{Spec: spec}); err != nil || n == 0 {
			t.Errorf("sample request: %d units, %v", n, err)
		}
	}
	var gpuContainers int
	for _, c := range pod.Spec.Containers {
		if _, ok := c.Resources.Limits[gpushare.ResourceName]; ok {
			gpuContainers++
		}
	}
	if gpuContainers < 2 {
		t.Errorf("multi-container sample has %d GPU containers, want at least 2", gpuContainers)
	}
}

func TestLoadRejects(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kustomization.yaml", "resources: [a.yaml]\nnamespace: x\n")
	write("a.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n")
	if _, err := Load(dir); err == nil {
		t.Error("a kustomization field the reader does not implement was accepted")
	}
	write("kustomization.yaml", "resources: [a.yaml]\nimages:\n- name: nothing\n  newTag: v1\n")
	if _, err := Load(dir); err == nil {
		t.Error("an images entry that matches nothing was accepted")
	}
	write("p.yaml", "- op: add\n  path: /data\n  value: {k: v}\n")
	write("kustomization.yaml", "resources: [a.yaml]\npatches:\n- path: p.yaml\n  target: {kind: ConfigMap, name: b}\n")
	if _, err := Load(dir); err == nil {
		t.Error("a patch whose target matches nothing was accepted")
	}
	write("kustomization.yaml", "resources: [a.yaml]\npatches:\n- path: p.yaml\n  target: {kind: ConfigMap, name: a}\n")
	if objs, err := Load(dir); err != nil || len(objs) != 1 || objs[0].Object["data"].(map[string]any)["k"] != "v" {
		t.Errorf("a JSON 6902 patch: %v, %v", objs, err)
	}
	write("p.yaml", "metadata:\n  labels: {x: y}\n")
	if _, err := Load(dir); err == nil {
		t.Error("a strategic-merge patch, which the reader does not implement, was accepted")
	}
	write("kustomization.yaml", "resources: [a.yaml]\n")
	write("a.yaml", "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    image: r.io/x:1\n---\n")
	objs, err := Load(dir)
	if err != nil || len(objs) != 1 {
		t.Fatalf("Load: %d objects, %v", len(objs), err)
	}
}
