package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
)

// SchedulerConfig is the part of a KubeSchedulerConfiguration the tests vary.
type SchedulerConfig struct {
	// Extenders are called in order, as kube-scheduler's extenders list.
	Extenders []Extender
	// ClientQPS and ClientBurst set the scheduler's API client limits; zero keeps its defaults
	// (50 and 100), which throttle binding POSTs in throughput tests.
	ClientQPS   float32
	ClientBurst int32
	// Verbosity is the scheduler's klog level; zero means 2 (one line per scheduled pod).
	Verbosity int
	// Binary is the scheduler program; empty means the bed's kube-scheduler. A program built on
	// kube-scheduler's command (gpushare-scheduler) takes the same flags.
	Binary string
	// Profiles, when set, is the configuration's profiles list as JSON, e.g. enabling an
	// out-of-tree plugin the Binary carries.
	Profiles json.RawMessage
}

// Extender is one entry of the scheduler's extenders list (kubescheduler.config.k8s.io/v1).
type Extender struct {
	URLPrefix        string
	FilterVerb       string
	PrioritizeVerb   string
	Weight           int64
	BindVerb         string
	PreemptVerb      string
	EnableHTTPS      bool
	TLS              *ExtenderTLS
	NodeCacheCapable bool
	Ignorable        bool
	// HTTPTimeout is zero for the scheduler's default (5s).
	HTTPTimeout      time.Duration
	ManagedResources []ManagedResource
}

// ExtenderTLS are the scheduler's TLS settings for an HTTPS extender.
type ExtenderTLS struct {
	Insecure   bool
	ServerName string // the name checked in the extender's certificate; empty: the URL's host
	CAFile     string
	CertFile   string
	KeyFile    string
}

// ManagedResource is an extended resource that routes a pod to the extender.
type ManagedResource struct {
	Name               string
	IgnoredByScheduler bool
}

// schedulerConfigJSON renders the configuration. JSON is valid YAML, which the scheduler reads.
func schedulerConfigJSON(cfg SchedulerConfig, kubeconfig string) ([]byte, error) {
	type tlsConfig struct {
		Insecure   bool   `json:"insecure,omitempty"`
		ServerName string `json:"serverName,omitempty"`
		CAFile     string `json:"caFile,omitempty"`
		CertFile   string `json:"certFile,omitempty"`
		KeyFile    string `json:"keyFile,omitempty"`
	}
	type managed struct {
		Name               string `json:"name"`
		IgnoredByScheduler bool   `json:"ignoredByScheduler"`
	}
	type extender struct {
		URLPrefix        string     `json:"urlPrefix"`
		FilterVerb       string     `json:"filterVerb,omitempty"`
		PrioritizeVerb   string     `json:"prioritizeVerb,omitempty"`
		Weight           int64      `json:"weight,omitempty"`
		BindVerb         string     `json:"bindVerb,omitempty"`
		PreemptVerb      string     `json:"preemptVerb,omitempty"`
		EnableHTTPS      bool       `json:"enableHTTPS"`
		TLSConfig        *tlsConfig `json:"tlsConfig,omitempty"`
		HTTPTimeout      string     `json:"httpTimeout,omitempty"`
		NodeCacheCapable bool       `json:"nodeCacheCapable"`
		ManagedResources []managed  `json:"managedResources,omitempty"`
		Ignorable        bool       `json:"ignorable"`
	}
	type clientConnection struct {
		Kubeconfig string  `json:"kubeconfig"`
		QPS        float32 `json:"qps,omitempty"`
		Burst      int32   `json:"burst,omitempty"`
	}
	type config struct {
		APIVersion       string           `json:"apiVersion"`
		Kind             string           `json:"kind"`
		ClientConnection clientConnection `json:"clientConnection"`
		LeaderElection   map[string]bool  `json:"leaderElection"`
		Extenders        []extender       `json:"extenders,omitempty"`
		Profiles         json.RawMessage  `json:"profiles,omitempty"`
	}
	out := config{
		APIVersion:       "kubescheduler.config.k8s.io/v1",
		Kind:             "KubeSchedulerConfiguration",
		ClientConnection: clientConnection{Kubeconfig: kubeconfig, QPS: cfg.ClientQPS, Burst: cfg.ClientBurst},
		LeaderElection:   map[string]bool{"leaderElect": false},
		Profiles:         cfg.Profiles,
	}
	for _, e := range cfg.Extenders {
		x := extender{
			URLPrefix: e.URLPrefix, FilterVerb: e.FilterVerb, PrioritizeVerb: e.PrioritizeVerb,
			Weight: e.Weight, BindVerb: e.BindVerb, PreemptVerb: e.PreemptVerb, EnableHTTPS: e.EnableHTTPS,
			NodeCacheCapable: e.NodeCacheCapable, Ignorable: e.Ignorable,
		}
		if e.HTTPTimeout > 0 {
			x.HTTPTimeout = e.HTTPTimeout.String()
		}
		if e.TLS != nil {
			x.TLSConfig = (*tlsConfig)(e.TLS)
		}
		for _, m := range e.ManagedResources {
			x.ManagedResources = append(x.ManagedResources, managed(m))
		}
		out.Extenders = append(out.Extenders, x)
	}
	return json.MarshalIndent(out, "", "  ")
}

// StartScheduler starts kube-scheduler with cfg and waits until it is ready. A running scheduler
// is stopped first, so this is also how a test restarts it or changes its extenders.
func (c *Cluster) StartScheduler(ctx context.Context, cfg SchedulerConfig) error {
	c.StopScheduler()
	kubeconfig := filepath.Join(c.dir, "scheduler.kubeconfig")
	if _, err := os.Stat(kubeconfig); err != nil {
		if _, err := c.Kubeconfig("scheduler", "system:kube-scheduler"); err != nil {
			return err
		}
	}
	data, err := schedulerConfigJSON(cfg, kubeconfig)
	if err != nil {
		return err
	}
	configPath := filepath.Join(c.dir, "scheduler-config.yaml")
	if err := os.WriteFile(configPath, data, 0o644); err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	verbosity := cfg.Verbosity
	if verbosity == 0 {
		verbosity = 2
	}
	binary := cfg.Binary
	if binary == "" {
		binary = filepath.Join(c.bin, "kube-scheduler")
	}
	proc := newProcess("kube-scheduler", binary, filepath.Join(c.dir, "kube-scheduler.log"), []string{
		"--config=" + configPath,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[0]),
		"--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
		"--v=" + strconv.Itoa(verbosity),
	})
	if err := proc.start(); err != nil {
		return err
	}
	c.mu.Lock()
	c.scheduler, c.schedPort = proc, ports[0]
	c.mu.Unlock()
	// The scheduler serves a self-signed certificate; /readyz is open to anonymous requests.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", ports[0])
	return waitUntil(ctx, c.timeout, "kube-scheduler", proc, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, insecure, url)
	})
}

// StopScheduler stops kube-scheduler if it runs.
func (c *Cluster) StopScheduler() {
	c.mu.Lock()
	p := c.scheduler
	c.mu.Unlock()
	if p != nil {
		p.stop(10 * time.Second)
	}
}

// KillScheduler kills kube-scheduler at once, as a crash would.
func (c *Cluster) KillScheduler() {
	c.mu.Lock()
	p := c.scheduler
	c.mu.Unlock()
	if p != nil {
		p.kill()
	}
}

// SchedulerCPUProfile reads a CPU profile of the running kube-scheduler over d (whole seconds,
// at least one) from its /debug/pprof/profile, as the cluster's admin: the scheduler
// authenticates the admin's client certificate and asks the API server whether it may.
func (c *Cluster) SchedulerCPUProfile(ctx context.Context, d time.Duration) ([]byte, error) {
	c.mu.Lock()
	port := c.schedPort
	c.mu.Unlock()
	cfg := rest.CopyConfig(c.restCfg)
	// The scheduler's serving certificate is self-signed; the admin's client certificate stays.
	cfg.TLSClientConfig.Insecure, cfg.TLSClientConfig.CAData, cfg.TLSClientConfig.CAFile = true, nil, ""
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/profile?seconds=%d", port, max(1, int(d.Seconds())))
	return httpGet(ctx, client, url)
}
