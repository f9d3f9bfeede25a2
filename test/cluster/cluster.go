package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Config says what to start. The zero value starts etcd, the apiserver and a scheduler without
// extenders in a new temporary directory.
type Config struct {
	// BinDir holds the bed's binaries; empty means Binaries().
	BinDir string
	// Dir keeps all state and logs; empty means a new temporary directory, removed by Stop.
	Dir string
	// NoScheduler starts no kube-scheduler (StartScheduler can start one later).
	NoScheduler bool
	// Scheduler configures the kube-scheduler.
	Scheduler SchedulerConfig
	// NoControllerManager starts no kube-controller-manager (StartControllerManager can start one
	// later): nothing then acts on Deployments, ReplicaSets, Jobs, DaemonSets, owner references or
	// namespace deletion, which is what a test that stands in for those controllers itself wants.
	NoControllerManager bool
	// ReadyTimeout bounds each component's start; zero means 60 seconds.
	ReadyTimeout time.Duration
}

// Cluster is a running control plane with its hollow kubelets.
type Cluster struct {
	dir      string
	ownDir   bool
	bin      string
	pki      *pki
	timeout  time.Duration
	apiPort  int
	etcd     *process
	api      *process
	admin    string // admin kubeconfig path
	restCfg  *rest.Config
	client   kubernetes.Interface
	apiProbe *http.Client

	mu          sync.Mutex
	scheduler   *process
	schedPort   int
	controllers *process // kube-controller-manager
	kubelets    map[string]*Kubelet
	programs    map[string]*Program
	stopped     bool
}

// Start brings up etcd, kube-apiserver, kube-controller-manager (unless cfg.NoControllerManager)
// and kube-scheduler (unless cfg.NoScheduler), each polled until ready. On error everything
// already started is stopped.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	bin := cfg.BinDir
	if bin == "" {
		if bin, err = Binaries(); err != nil {
			return nil, err
		}
	}
	c = &Cluster{bin: bin, dir: cfg.Dir, timeout: cfg.ReadyTimeout, kubelets: map[string]*Kubelet{}, programs: map[string]*Program{}}
	if c.timeout == 0 {
		c.timeout = 60 * time.Second
	}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "gpushare-cluster-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.pki, err = newPKI(filepath.Join(c.dir, "pki")); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	if err = c.startEtcd(ctx, ports[0], ports[1]); err != nil {
		return nil, err
	}
	c.apiPort = ports[2]
	if err = c.startAPIServer(ctx, ports[0]); err != nil {
		return nil, err
	}
	if !cfg.NoControllerManager {
		if err = c.StartControllerManager(ctx); err != nil {
			return nil, err
		}
	}
	if !cfg.NoScheduler {
		if err = c.StartScheduler(ctx, cfg.Scheduler); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) startEtcd(ctx context.Context, clientPort, peerPort int) error {
	client := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	c.etcd = newProcess("etcd", filepath.Join(c.bin, "etcd"), filepath.Join(c.dir, "etcd.log"), []string{
		"--name=bed", "--data-dir=" + filepath.Join(c.dir, "etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=bed=" + peer,
		"--quota-backend-bytes=2147483648", "--log-level=warn",
		"--unsafe-no-fsync", // test data only: fsync dominates etcd latency on a shared disk
	})
	if err := c.etcd.start(); err != nil {
		return err
	}
	return waitUntil(ctx, c.timeout, "etcd", c.etcd, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, http.DefaultClient, client+"/health")
	})
}

func (c *Cluster) startAPIServer(ctx context.Context, etcdPort int) error {
	serving, err := c.pki.issueServing("apiserver", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
	if err != nil {
		return err
	}
	if c.admin, err = c.Kubeconfig("admin", "admin", "system:masters"); err != nil {
		return err
	}
	c.api = newProcess("kube-apiserver", filepath.Join(c.bin, "kube-apiserver"), filepath.Join(c.dir, "kube-apiserver.log"), []string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(etcdPort),
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(c.apiPort),
		// A loopback advertise address is refused unless no endpoint reconciler runs.
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--tls-cert-file=" + serving.Cert, "--tls-private-key-file=" + serving.Key,
		"--client-ca-file=" + c.pki.CAFile(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.pki.saPubFile(), "--service-account-signing-key-file=" + c.pki.saKeyFile(),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		// ServiceAccount admission would refuse a pod created in a namespace before the
		// ServiceAccount controller made its "default" ServiceAccount (tests create both at once),
		// and hollow kubelets mount no token volumes; the controller-manager runs no node lifecycle
		// controller (ControllerManagerControllers), so TaintNodesByCondition's not-ready taint on
		// every new Node would stay forever.
		"--enable-admission-plugins=NodeRestriction",
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		"--allow-privileged=true",
	})
	if err := c.api.start(); err != nil {
		return err
	}
	if c.restCfg, err = clientcmd.BuildConfigFromFlags("", c.admin); err != nil {
		return err
	}
	// Tests create thousands of objects; client-go's default 5 QPS would make that the bottleneck.
	c.restCfg.QPS, c.restCfg.Burst = 1000, 2000
	if c.client, err = kubernetes.NewForConfig(c.restCfg); err != nil {
		return err
	}
	probe, err := rest.HTTPClientFor(c.restCfg)
	if err != nil {
		return err
	}
	c.apiProbe = probe
	return c.waitAPIServer(ctx)
}

func (c *Cluster) waitAPIServer(ctx context.Context) error {
	return waitUntil(ctx, c.timeout, "kube-apiserver", c.api, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, c.apiProbe, c.APIServerURL()+"/readyz")
	})
}

// RestartAPIServer stops the apiserver and starts it again with the same flags and data.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.api.stop(10 * time.Second)
	if err := c.api.start(); err != nil {
		return err
	}
	return c.waitAPIServer(ctx)
}

// Kubeconfig writes a kubeconfig for a client-certificate identity (CN=user, O=groups) and
// returns its path. name must be unique within the cluster.
func (c *Cluster) Kubeconfig(name, user string, groups ...string) (string, error) {
	pair, err := c.pki.issueClient(name, user, groups...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, name+".kubeconfig")
	cfg := clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{"bed": {
			Server: c.APIServerURL(), CertificateAuthority: c.pki.CAFile(),
		}},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{name: {
			ClientCertificate: pair.Cert, ClientKey: pair.Key,
		}},
		Contexts:       map[string]*clientcmdapi.Context{"bed": {Cluster: "bed", AuthInfo: name}},
		CurrentContext: "bed",
	}
	if err := clientcmd.WriteToFile(cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return path, nil
}

// ServingCert issues a certificate for a server on loopback (an extender with HTTPS, say), signed
// by the cluster CA; it returns the certificate, key and CA file paths.
func (c *Cluster) ServingCert(name string) (cert, key, ca string, err error) {
	pair, err := c.pki.issueServing(name)
	return pair.Cert, pair.Key, c.pki.CAFile(), err
}

// Dir is the directory holding the cluster's state and logs.
func (c *Cluster) Dir() string { return c.dir }

// APIServerURL is the apiserver's https URL.
func (c *Cluster) APIServerURL() string { return "https://127.0.0.1:" + strconv.Itoa(c.apiPort) }

// AdminKubeconfig is the path of a kubeconfig with cluster-admin (system:masters) rights.
func (c *Cluster) AdminKubeconfig() string { return c.admin }

// RESTConfig returns a copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restCfg) }

// Client is an admin clientset.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// ClientWithLimits returns an admin client with its own rate limits, for a component run in the
// test process that must see the limits it ships with rather than Client's generous ones.
func (c *Cluster) ClientWithLimits(qps float32, burst int) (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(c.restCfg)
	cfg.QPS, cfg.Burst = qps, burst
	return kubernetes.NewForConfig(cfg)
}

// Stop stops every component (kubelets first, etcd last) and removes the directory when Start
// created it. It is safe to call more than once.
func (c *Cluster) Stop() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	kubelets := make([]*Kubelet, 0, len(c.kubelets))
	for _, k := range c.kubelets {
		kubelets = append(kubelets, k)
	}
	sched, controllers := c.scheduler, c.controllers
	programs := make([]*Program, 0, len(c.programs))
	for _, p := range c.programs {
		programs = append(programs, p)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	// Our programs first: they talk to kubelets and the API server, which stop after them.
	for _, p := range programs {
		wg.Go(func() { p.proc.stop(5 * time.Second) })
	}
	wg.Wait()
	for _, k := range kubelets {
		wg.Go(func() {
			k.proc.stop(5 * time.Second)
			k.runtime.stop(5 * time.Second)
		})
	}
	wg.Wait()
	for _, p := range []*process{sched, controllers, c.api, c.etcd} {
		if p != nil {
			p.stop(10 * time.Second)
		}
	}
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}

// Logs returns the last n lines of every component's log, each under a header.
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	for _, p := range c.processes() {
		fmt.Fprintf(&b, "---- %s (%s), last %d lines\n%s\n", p.name, p.logPath, n, p.logTail(n))
	}
	return b.String()
}

func (c *Cluster) processes() []*process {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []*process
	for _, p := range []*process{c.etcd, c.api, c.controllers, c.scheduler} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	names := make([]string, 0, len(c.kubelets))
	for name := range c.kubelets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ps = append(ps, c.kubelets[name].proc, c.kubelets[name].runtime)
	}
	progs := make([]string, 0, len(c.programs))
	for name := range c.programs {
		progs = append(progs, name)
	}
	sort.Strings(progs)
	for _, name := range progs {
		ps = append(ps, c.programs[name].proc)
	}
	return ps
}

func httpOK(ctx context.Context, client *http.Client, url string) (bool, error) {
	_, err := httpGet(ctx, client, url)
	return err == nil, err
}

// httpGet reads url's body; any status but 200 is an error naming it and the body.
func httpGet(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return body, nil
}
