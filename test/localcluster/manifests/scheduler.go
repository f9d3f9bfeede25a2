package manifests

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/gpushare/gpushare/test/cluster"
)

// The default scheduler's KubeSchedulerConfiguration, relative to Dir: plain HTTP, and mutual TLS
// (the mtls overlay).
const (
	SchedulerConfigFile     = "scheduler/kube-scheduler-config.yaml"
	MTLSSchedulerConfigFile = "mtls/kube-scheduler-config.yaml"
)

// MostAllocatedConfig returns the measured, unshipped configuration without the prioritize verb
// (nodes ranked by NodeResourcesFit MostAllocated on gpu-mem), kept beside this source file.
func MostAllocatedConfig() ([]byte, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("cannot locate the MostAllocated configuration")
	}
	return os.ReadFile(filepath.Join(filepath.Dir(file), "testdata", "kube-scheduler-config-mostallocated.yaml"))
}

// Second-scheduler names in manifests/second-scheduler.
const (
	SecondSchedulerDir       = "second-scheduler"
	SecondSchedulerConfigMap = "gpushare-scheduler-config"
	SecondSchedulerConfigKey = "config.yaml"
	SecondSchedulerName      = "gpushare-scheduler"
	// PluginSchedulerDir holds gpushare-scheduler (kube-scheduler with the GPUShare plugin), an
	// alternative to SecondSchedulerDir with the same names.
	PluginSchedulerDir = "scheduler-plugin"
)

// extenderConfig mirrors kubescheduler.config.k8s.io/v1 Extender for the fields the manifests set.
type extenderConfig struct {
	URLPrefix      string `json:"urlPrefix"`
	FilterVerb     string `json:"filterVerb"`
	PrioritizeVerb string `json:"prioritizeVerb"`
	Weight         int64  `json:"weight"`
	BindVerb       string `json:"bindVerb"`
	PreemptVerb    string `json:"preemptVerb"`
	EnableHTTPS    bool   `json:"enableHTTPS"`
	TLS            *struct {
		ServerName string `json:"serverName"`
		CAFile     string `json:"caFile"`
		CertFile   string `json:"certFile"`
		KeyFile    string `json:"keyFile"`
	} `json:"tlsConfig"`
	HTTPTimeout      *string `json:"httpTimeout"`
	NodeCacheCapable bool    `json:"nodeCacheCapable"`
	ManagedResources []struct {
		Name               string `json:"name"`
		IgnoredByScheduler bool   `json:"ignoredByScheduler"`
	} `json:"managedResources"`
	Ignorable bool `json:"ignorable"`
}

// Extenders returns the extenders of a KubeSchedulerConfiguration as the test bed's type, with
// every URL prefix replaced by urlPrefix, so the demo runs the shipped settings against its own
// extender. Files named in tlsConfig are passed through files (nil: kept as shipped), so a test
// can point them at its own copies.
func Extenders(config []byte, urlPrefix string, files func(string) string) ([]cluster.Extender, error) {
	if files == nil {
		files = func(f string) string { return f }
	}
	var cfg struct {
		Extenders []extenderConfig `json:"extenders"`
	}
	if err := yaml.Unmarshal(config, &cfg); err != nil {
		return nil, err
	}
	var out []cluster.Extender
	for _, e := range cfg.Extenders {
		x := cluster.Extender{
			URLPrefix: urlPrefix, FilterVerb: e.FilterVerb, PrioritizeVerb: e.PrioritizeVerb, Weight: e.Weight,
			BindVerb: e.BindVerb, PreemptVerb: e.PreemptVerb, EnableHTTPS: e.EnableHTTPS, NodeCacheCapable: e.NodeCacheCapable, Ignorable: e.Ignorable,
		}
		if t := e.TLS; t != nil {
			x.TLS = &cluster.ExtenderTLS{ServerName: t.ServerName, CAFile: files(t.CAFile), CertFile: files(t.CertFile), KeyFile: files(t.KeyFile)}
		}
		if e.HTTPTimeout != nil {
			d, err := time.ParseDuration(*e.HTTPTimeout)
			if err != nil {
				return nil, fmt.Errorf("httpTimeout: %w", err)
			}
			x.HTTPTimeout = d
		}
		for _, m := range e.ManagedResources {
			x.ManagedResources = append(x.ManagedResources, cluster.ManagedResource{Name: m.Name, IgnoredByScheduler: m.IgnoredByScheduler})
		}
		out = append(out, x)
	}
	return out, nil
}

// RewriteSchedulerConfig returns config with clientConnection.kubeconfig set to kubeconfig and
// every extender's urlPrefix set to urlPrefix; everything else is kept as shipped.
func RewriteSchedulerConfig(config []byte, kubeconfig, urlPrefix string) ([]byte, error) {
	var m map[string]any
	if err := yaml.Unmarshal(config, &m); err != nil {
		return nil, err
	}
	if err := unstructured.SetNestedField(m, kubeconfig, "clientConnection", "kubeconfig"); err != nil {
		return nil, err
	}
	exts, _, err := unstructured.NestedSlice(m, "extenders")
	if err != nil {
		return nil, err
	}
	for _, e := range exts {
		e, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("extenders entry is not an object")
		}
		e["urlPrefix"] = urlPrefix
	}
	if err := unstructured.SetNestedSlice(m, exts, "extenders"); err != nil {
		return nil, err
	}
	return yaml.Marshal(m)
}

// SecondSchedulerConfig returns the KubeSchedulerConfiguration shipped in the second scheduler's
// ConfigMap.
func SecondSchedulerConfig(dir string) ([]byte, error) {
	return configMapConfig(filepath.Join(dir, SecondSchedulerDir))
}

// PluginSchedulerConfig returns the KubeSchedulerConfiguration shipped for gpushare-scheduler
// (manifests/scheduler-plugin), whose profile enables the GPUShare plugin.
func PluginSchedulerConfig(dir string) ([]byte, error) {
	return configMapConfig(filepath.Join(dir, PluginSchedulerDir))
}

// PluginSchedulerProfiles returns the profiles of PluginSchedulerConfig as JSON, every profile
// renamed schedulerName (a test bed schedules its pods with the default name).
func PluginSchedulerProfiles(dir, schedulerName string) (json.RawMessage, error) {
	data, err := PluginSchedulerConfig(dir)
	if err != nil {
		return nil, err
	}
	return Profiles(data, schedulerName)
}

// Profiles returns the profiles of a KubeSchedulerConfiguration as JSON, every profile renamed
// schedulerName; it fails when there are none.
func Profiles(data []byte, schedulerName string) (json.RawMessage, error) {
	var cfg struct {
		Profiles []map[string]any `json:"profiles"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, err
	}
	if len(cfg.Profiles) == 0 {
		return nil, errors.New("the scheduler configuration has no profiles")
	}
	for _, p := range cfg.Profiles {
		p["schedulerName"] = schedulerName
	}
	return json.Marshal(cfg.Profiles)
}

// configMapConfig returns the configuration in the scheduler ConfigMap of the manifests in dir.
func configMapConfig(dir string) ([]byte, error) {
	objs, err := Load(dir)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == SecondSchedulerConfigMap {
			data, found, err := unstructured.NestedString(o.Object, "data", SecondSchedulerConfigKey)
			if err != nil || !found {
				return nil, fmt.Errorf("ConfigMap %s has no data.%s (%v)", SecondSchedulerConfigMap, SecondSchedulerConfigKey, err)
			}
			return []byte(data), nil
		}
	}
	return nil, fmt.Errorf("%s has no ConfigMap %s", dir, SecondSchedulerConfigMap)
}

// SchedulerConfig reads the default scheduler's shipped configuration.
func SchedulerConfig(dir string) ([]byte, error) {
	return os.ReadFile(filepath.Join(dir, SchedulerConfigFile))
}
