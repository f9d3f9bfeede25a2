package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeletOptions configures a hollow kubelet.
type KubeletOptions struct {
	// Labels the node registers with.
	Labels map[string]string
	// StatusUpdateFrequency is how often the node's status (and so device-plugin capacity) is
	// pushed; zero means 1s, so tests see a plugin's capacity quickly.
	StatusUpdateFrequency time.Duration
	// MaxPods is the node's pod capacity; zero means 110.
	MaxPods int
	// KubeAPILimits runs the kubelet's API client at the real kubelet's limits (50 queries per
	// second, burst 100) instead of client-go's 5 and 10.
	KubeAPILimits bool
	// RecordEvents posts the kubelet's Events (FailedPrepareDynamicResources, ...) as a real
	// kubelet does; off, kubemark's recorder drops them and the load stays as measured before.
	RecordEvents bool
}

// Kubelet is a hollow kubelet running the real kubelet device manager, beside its fake container
// runtime. The runtime is a process of its own, like containerd: it keeps the node's containers
// running across kubelet restarts.
type Kubelet struct {
	name    string
	rootDir string
	proc    *process
	runtime *process
	cluster *Cluster
}

// AddKubelet starts a hollow kubelet for node name (with the node identity
// system:node:<name>, as the Node authorizer requires) and waits until its Node is Ready and its
// device-plugin registration socket answers.
func (c *Cluster) AddKubelet(ctx context.Context, name string, opts KubeletOptions) (*Kubelet, error) {
	c.mu.Lock()
	if _, dup := c.kubelets[name]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("kubelet %s already exists", name)
	}
	c.mu.Unlock()
	kubeconfig, err := c.Kubeconfig("kubelet-"+name, "system:node:"+name, "system:nodes")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(c.dir, "kubelets", name)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	every := opts.StatusUpdateFrequency
	if every == 0 {
		every = time.Second
	}
	maxPods := opts.MaxPods
	if maxPods == 0 {
		maxPods = 110
	}
	criEndpoint := "unix://" + filepath.Join(root, "cri.sock")
	args := []string{
		"-kubeconfig=" + kubeconfig, "-name=" + name, "-root-dir=" + root,
		"-container-runtime-endpoint=" + criEndpoint,
		"-kubelet-port=" + strconv.Itoa(ports[0]),
		"-node-status-update-frequency=" + every.String(),
		"-max-pods=" + strconv.Itoa(maxPods),
	}
	if len(opts.Labels) > 0 {
		args = append(args, "-node-labels="+joinLabels(opts.Labels))
	}
	if opts.KubeAPILimits {
		args = append(args, "-kube-api-limits")
	}
	if opts.RecordEvents {
		args = append(args, "-record-events")
	}
	k := &Kubelet{
		name: name, rootDir: root, cluster: c,
		proc: newProcess("kubelet-"+name, filepath.Join(c.bin, "hollow-kubelet"), filepath.Join(c.dir, "kubelet-"+name+".log"), args),
		runtime: newProcess("runtime-"+name, filepath.Join(c.bin, "fake-cri"), filepath.Join(c.dir, "runtime-"+name+".log"),
			[]string{"-endpoint=" + criEndpoint}),
	}
	c.mu.Lock()
	c.kubelets[name] = k
	c.mu.Unlock()
	if err := k.runtime.start(); err != nil {
		return nil, err
	}
	if err := waitUntil(ctx, c.timeout, "container runtime of "+name, k.runtime, func(context.Context) (bool, error) {
		return socketAnswers(filepath.Join(root, "cri.sock")), nil
	}); err != nil {
		return nil, err
	}
	return k, k.Start(ctx)
}

func joinLabels(labels map[string]string) string {
	kv := make([]string, 0, len(labels))
	for k, v := range labels {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// Name is the node's name.
func (k *Kubelet) Name() string { return k.name }

// RootDir is the kubelet's root directory; it survives restarts.
func (k *Kubelet) RootDir() string { return k.rootDir }

// DevicePluginDir is where device plugins put their sockets and find kubelet.sock.
func (k *Kubelet) DevicePluginDir() string { return filepath.Join(k.rootDir, "device-plugins") }

// RegistrationSocket is the kubelet's device-plugin registration socket.
func (k *Kubelet) RegistrationSocket() string {
	return filepath.Join(k.DevicePluginDir(), "kubelet.sock")
}

// CheckpointPath is the device manager's checkpoint: which container got which devices and env.
func (k *Kubelet) CheckpointPath() string {
	return filepath.Join(k.DevicePluginDir(), "kubelet_internal_checkpoint")
}

// PluginsRegistryDir is where plugins other than device plugins (DRA drivers) put their
// registration sockets; the kubelet's plugin manager watches it (<root>/plugins_registry, as a
// real kubelet's).
func (k *Kubelet) PluginsRegistryDir() string { return filepath.Join(k.rootDir, "plugins_registry") }

// PluginDataDir is the data directory of the kubelet plugin named driver (its DRA socket and
// state): <root>/plugins/<driver>.
func (k *Kubelet) PluginDataDir(driver string) string {
	return filepath.Join(k.rootDir, "plugins", driver)
}

// CDISpecDir is the CDI specification directory the node's runtime (fake-cri) reads.
func (k *Kubelet) CDISpecDir() string { return filepath.Join(k.rootDir, "cdi") }

// DRACheckpointPath is the kubelet DRA manager's claim-info checkpoint.
func (k *Kubelet) DRACheckpointPath() string { return filepath.Join(k.rootDir, "dra_manager_state") }

// PodResourcesSocket is the kubelet's pod-resources API socket.
func (k *Kubelet) PodResourcesSocket() string {
	return filepath.Join(k.rootDir, "pod-resources", "kubelet.sock")
}

// LogLines returns the lines of the kubelet's log (every start of it) that contain substr. The
// hollow kubelet records events with kubemark's fake recorder, which posts none to the API server:
// what a real kubelet reports as a pod's event, the bed shows in this log.
func (k *Kubelet) LogLines(substr string) []string {
	data, err := os.ReadFile(k.proc.logPath)
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(data), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// Running tells whether the kubelet process is alive.
func (k *Kubelet) Running() bool { return k.proc.running() }

// Start starts a stopped kubelet with the same root directory (a kubelet restart: it wipes
// plugin sockets and restores its checkpoint) and waits until it is ready again.
func (k *Kubelet) Start(ctx context.Context) error {
	if err := k.proc.start(); err != nil {
		return err
	}
	return waitUntil(ctx, k.cluster.timeout, "kubelet "+k.name, k.proc, func(ctx context.Context) (bool, error) {
		if !socketAnswers(k.RegistrationSocket()) {
			return false, fmt.Errorf("%s does not answer", k.RegistrationSocket())
		}
		node, err := k.cluster.client.CoreV1().Nodes().Get(ctx, k.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return nodeReady(node), fmt.Errorf("node %s is not Ready", k.name)
	})
}

// Stop stops the kubelet gracefully. Its pods, their containers and the Node stay, as when a real
// kubelet stops.
func (k *Kubelet) Stop() { k.proc.stop(5 * time.Second) }

// Kill kills the kubelet at once, as a crash would.
func (k *Kubelet) Kill() { k.proc.kill() }

// Restart stops the kubelet and starts it again.
func (k *Kubelet) Restart(ctx context.Context) error {
	k.Stop()
	return k.Start(ctx)
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
