package manifests

import (
	"encoding/json"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestPluginScheduler checks manifests/scheduler-plugin: its configuration enables GPUShare at
// every extension point with its Bind ahead of the default binder and calls no extender, the
// Deployment runs gpushare-scheduler with that configuration, the lease matches its Role, and the
// one right beyond system:kube-scheduler's is reading the unhealthy-GPU ConfigMaps.
func TestPluginScheduler(t *testing.T) {
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := PluginSchedulerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	type named struct {
		Name string `json:"name"`
	}
	var cfg struct {
		LeaderElection struct {
			ResourceName string `json:"resourceName"`
		} `json:"leaderElection"`
		Extenders []json.RawMessage `json:"extenders"`
		Profiles  []struct {
			SchedulerName string `json:"schedulerName"`
			Plugins       struct {
				MultiPoint struct{ Enabled []named } `json:"multiPoint"`
				Bind       struct{ Enabled, Disabled []named }
			} `json:"plugins"`
			PluginConfig []struct {
				Name string          `json:"name"`
				Args json.RawMessage `json:"args"`
			} `json:"pluginConfig"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Extenders) != 0 || len(cfg.Profiles) != 1 {
		t.Fatalf("want one profile and no extender: %s", data)
	}
	p := cfg.Profiles[0]
	bind := p.Plugins.Bind.Enabled
	if p.SchedulerName != SecondSchedulerName || !slices.Contains(p.Plugins.MultiPoint.Enabled, named{"GPUShare"}) ||
		len(bind) != 2 || bind[0].Name != "GPUShare" || bind[1].Name != "DefaultBinder" ||
		len(p.PluginConfig) != 1 || p.PluginConfig[0].Name != "GPUShare" {
		t.Errorf("profile %+v", p)
	}
	objs := loadT(t, PluginSchedulerDir)
	role := convert[rbacv1.Role](t, objs["Role kube-system/gpushare-scheduler-leader-election"])
	if !slices.Contains(role.Rules[0].ResourceNames, cfg.LeaderElection.ResourceName) {
		t.Errorf("leader-election Role names %v, the config's lease is %q", role.Rules[0].ResourceNames, cfg.LeaderElection.ResourceName)
	}
	extra := convert[rbacv1.Role](t, objs["Role kube-system/gpushare-scheduler-unhealthy-gpus"])
	if len(extra.Rules) != 1 || !slices.Equal(extra.Rules[0].Resources, []string{"configmaps"}) || !slices.Equal(extra.Rules[0].Verbs, []string{"list", "watch"}) {
		t.Errorf("extra rights %+v", extra.Rules)
	}
	d := convert[appsv1.Deployment](t, objs["Deployment kube-system/gpushare-scheduler"])
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "registry.example.com/gpushare/gpushare-scheduler:dev" || !slices.Equal(c.Command, []string{"/gpushare-scheduler"}) ||
		!slices.Contains(c.Args, "--config=/etc/gpushare-scheduler/config.yaml") {
		t.Errorf("container %s %v %v", c.Image, c.Command, c.Args)
	}
}
