// Command localcluster is `make demo`: it builds the gpushare programs, starts the local test bed
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and hollow GPU nodes running the
// real kubelet device manager and DRA manager with fake containers, all on loopback), runs our
// device plugin on the device-plugin nodes (simulated GPUs of mixed sizes) with our scheduler
// extender wired into kube-scheduler with the shipped configuration, and our DRA driver on the DRA
// nodes with the webhook translating gpushare pods of one opted-in namespace; it applies the sample
// workloads from manifests/samples, unchanged, in namespace default and in that namespace (a
// Deployment's pods are its ReplicaSet's), waits for them to run, prints `kubectl inspect gpushare`
// and `-d` (both kinds of node), and then keeps the cluster running with a KUBECONFIG to export
// until Ctrl-C (or SIGTERM), when it stops everything and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// The programs' names under bin/.
const (
	extenderBin  = "gpushare-scheduler-extender"
	pluginBin    = "gpushare-device-plugin"
	inspectorBin = "kubectl-inspect-gpushare"
)

// backends are the simulated machines the nodes cycle through: 8×80 GB, 8×40 GB, and 2×80 + 2×40 GB.
var backends = []string{"simulated:dgxh100", "simulated:dgxa100", "simulated:mixed"}

func main() {
	nodes := flag.Int("nodes", 3, "hollow GPU nodes to start (label gpushare=true; simulated GPUs: "+strings.Join(backends, ", ")+", in turn)")
	dir := flag.String("dir", "", "keep the cluster's state and logs here (default: a temporary directory removed on exit)")
	draNodes := flag.Int("dra-nodes", 1, "hollow GPU nodes in DRA mode (label gpushare.io/dra=true; "+draBackend+"), served by our DRA driver, with the webhook translating gpushare pods of namespace "+draNamespace)
	samples := flag.Bool("samples", true, "apply manifests/samples (in default, and in "+draNamespace+" when there are DRA nodes) and wait for them")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// Once asked to stop, give the signals back: a second Ctrl-C kills at once, and the
		// children die with us (Pdeathsig) even when stopping them hangs.
		<-ctx.Done()
		stop()
	}()
	err := run(ctx, options{nodes: *nodes, draNodes: *draNodes, dir: *dir, samples: *samples})
	switch {
	case err == nil:
		fmt.Println("stopped")
	case ctx.Err() != nil:
		// Stopped by Ctrl-C or SIGTERM: whatever failed after that failed because we stopped it.
		fmt.Println("stopped before the demo was up:", err)
	default:
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		stop()
		os.Exit(1)
	}
}

// options are the demo's flags.
type options struct {
	nodes, draNodes int
	dir             string
	samples         bool
}

func run(ctx context.Context, o options) error {
	began := time.Now()
	manifestDir, err := manifests.Dir()
	if err != nil {
		return err
	}
	root := filepath.Dir(manifestDir)
	binDir := filepath.Join(root, "bin")

	// The programs build while the control plane starts; the extender needs them first.
	fmt.Println("building the gpushare programs into bin/ (go build ./cmd/...), meanwhile starting the cluster...")
	built := make(chan error, 1)
	go func() {
		start := time.Now()
		if err := buildPrograms(ctx, root, binDir); err != nil {
			built <- err
			return
		}
		fmt.Printf("programs built in %s\n", since(start))
		built <- nil
	}()
	// Whatever happens next, wait for the build: no go build may outlive the demo.
	buildErr := func() error { err := <-built; built <- err; return err }
	defer buildErr() //nolint:errcheck // reported where it is first needed

	start := time.Now()
	fmt.Println("building the test bed (cached after the first run; about 12 minutes cold on 2 cores)...")
	bed, err := buildBed(ctx, root)
	if err != nil {
		return err
	}
	fmt.Printf("test bed ready in %s: %s\n", since(start), bed)

	start = time.Now()
	c, err := cluster.Start(ctx, cluster.Config{BinDir: bed, Dir: o.dir, NoScheduler: true})
	if err != nil {
		return err
	}
	defer c.Stop()
	fmt.Printf("control plane ready in %s (state and logs in %s)\n", since(start), c.Dir())

	// Our programs run as the shipped ServiceAccounts, with only the shipped RBAC.
	applier, err := manifests.NewApplier(c.RESTConfig(), "gpushare-demo")
	if err != nil {
		return err
	}
	if err := applyRights(ctx, applier, manifestDir); err != nil {
		return err
	}
	if err := buildErr(); err != nil {
		return err
	}
	procs := &processes{}
	defer procs.stopAll()
	if err := startExtender(ctx, c, procs, binDir, manifestDir); err != nil {
		return err
	}
	var nodeNames []string
	for i := range o.nodes {
		name := fmt.Sprintf("gpu-node-%d", i)
		if err := addPluginNode(ctx, c, procs, binDir, name, backends[i%len(backends)]); err != nil {
			return err
		}
		nodeNames = append(nodeNames, name)
	}
	pool := &draPool{c: c, procs: procs, binDir: binDir, dir: filepath.Join(manifestDir, "dra")}
	if o.draNodes > 0 {
		if err := startDRAPool(ctx, pool, applier, o.draNodes); err != nil {
			return err
		}
	}
	if o.samples {
		if err := runSamples(ctx, c, applier, manifestDir, binDir, len(pool.nodes) > 0); err != nil {
			return err
		}
	}
	fmt.Printf(`
The demo is up after %s: %d hollow GPU nodes in device-plugin mode (%s), our device plugin on each,
our scheduler extender in kube-scheduler; %d in DRA mode (%s), our DRA driver on each, and the
webhook translating gpushare pods of namespace %s; kube-controller-manager for Deployments, Jobs,
garbage collection and ResourceClaims. State and logs (one per process) are in %s.
In another shell:

  export KUBECONFIG=%s
  export PATH=%s:$PATH     # kubectl inspect gpushare
  kubectl get deployments,pods -o wide -A
  kubectl inspect gpushare -d
  kubectl inspect gpushare ui      # the live map in your browser (127.0.0.1 only)
  kubectl scale deployment gpushare-sample --replicas=10
  kubectl -n %s scale deployment gpushare-sample --replicas=10

Containers are fake (the hollow kubelet runs no images); every GPU is simulated.
Press Ctrl-C here to stop everything.
`, since(began), len(nodeNames), strings.Join(nodeNames, ", "), len(pool.nodes), strings.Join(pool.nodes, ", "), draNamespace,
		c.Dir(), c.AdminKubeconfig(), binDir, draNamespace)
	select {
	case <-ctx.Done():
		fmt.Println("\nstopping (a few seconds; Ctrl-C again kills at once)...")
		return nil
	case p := <-procs.died:
		return fmt.Errorf("%s exited; see %s", p.name, p.log)
	}
}

// applyRights applies the RBAC and admission objects of manifests/: our processes run with
// exactly these rights.
func applyRights(ctx context.Context, applier *manifests.Applier, manifestDir string) error {
	install, err := manifests.Load(manifestDir)
	if err != nil {
		return err
	}
	var rights []*unstructured.Unstructured
	for _, o := range install {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			rights = append(rights, o)
		}
	}
	if err := applier.ApplyAll(ctx, rights); err != nil {
		return err
	}
	fmt.Printf("applied the %d RBAC and admission objects of manifests/ (our processes run with exactly these rights)\n", len(rights))
	return nil
}

// startExtender runs our extender with its ServiceAccount's rights and kube-scheduler with the
// shipped extender configuration.
func startExtender(ctx context.Context, c *cluster.Cluster, procs *processes, binDir, manifestDir string) error {
	start := time.Now()
	extKubeconfig, err := c.Kubeconfig("gpushare-scheduler-extender", "system:serviceaccount:kube-system:gpushare-scheduler-extender")
	if err != nil {
		return err
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	ext, err := procs.start(ctx, "extender", filepath.Join(binDir, extenderBin), filepath.Join(c.Dir(), extenderBin+".log"), nil,
		"--listen="+addr, "--kubeconfig="+extKubeconfig)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, time.Minute, ext, "extender /readyz", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return err
	}
	fmt.Printf("scheduler extender ready in %s on http://%s\n", since(start), addr)

	start = time.Now()
	schedCfg, err := manifests.SchedulerConfig(manifestDir)
	if err != nil {
		return err
	}
	extenders, err := manifests.Extenders(schedCfg, "http://"+addr+"/gpushare-scheduler", nil)
	if err != nil {
		return err
	}
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{Extenders: extenders}); err != nil {
		return err
	}
	fmt.Printf("kube-scheduler ready in %s with the extender settings of %s\n", since(start), manifests.SchedulerConfigFile)
	return nil
}

// addPluginNode starts a hollow kubelet labelled gpushare=true and our device plugin for it on a
// simulator of backend, and waits until the node advertises gpu-mem.
func addPluginNode(ctx context.Context, c *cluster.Cluster, procs *processes, binDir, name, backend string) error {
	start := time.Now()
	// The real kubelet's API limits: at client-go's 5 queries per second the demo's pods took
	// tens of seconds to show Running (docs/benchmarks.md, saturating burst).
	k, err := c.AddKubelet(ctx, name, cluster.KubeletOptions{
		Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}, KubeAPILimits: true,
	})
	if err != nil {
		return err
	}
	// The credentials of the plugin's DaemonSet pod on this node: a token of its ServiceAccount
	// bound to a pod there, whose node the shipped admission policy requires of its writes.
	pluginKubeconfig, err := c.PodTokenKubeconfig(ctx, "kube-system", "gpushare-device-plugin", "gpushare-device-plugin-"+name, name)
	if err != nil {
		return err
	}
	p, err := procs.start(ctx, "device plugin on "+name, filepath.Join(binDir, pluginBin), filepath.Join(c.Dir(), pluginBin+"-"+name+".log"),
		[]string{gpushare.EnvNodeName + "=" + name},
		"--gpu-backend="+backend, "--device-plugin-dir="+k.DevicePluginDir(), "--kubeconfig="+pluginKubeconfig,
		// Its kubelet's pod-resources API, as on a real node: how the plugin confirms which
		// container each Allocate went to before recording it on the pod.
		"--pod-resources-socket="+k.PodResourcesSocket())
	if err != nil {
		return err
	}
	var units int64
	if err := waitFor(ctx, time.Minute, p, "node "+name+" advertising aliyun.com/gpu-mem", func() bool {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q := n.Status.Allocatable[gpushare.ResourceName]
		units = q.Value()
		return units > 0 && n.Annotations[gpushare.AnnotationNodeGPUs] != ""
	}); err != nil {
		return err
	}
	fmt.Printf("node %s ready in %s: %s, %d GiB of aliyun.com/gpu-mem\n", name, since(start), backend, units)
	return nil
}

// startDRAPool applies manifests/dra's rights, starts n DRA nodes and the webhook.
func startDRAPool(ctx context.Context, pool *draPool, applier *manifests.Applier, n int) error {
	objs, err := pool.applyRights(ctx, applier)
	if err != nil {
		return err
	}
	for i := range n {
		if err := pool.addNode(ctx, fmt.Sprintf("dra-node-%d", i)); err != nil {
			return err
		}
	}
	return pool.startWebhook(ctx, objs)
}

// runSamples applies manifests/samples in namespace default and, with DRA nodes, unchanged in
// draNamespace, waits for them, and prints kubectl inspect gpushare.
func runSamples(ctx context.Context, c *cluster.Cluster, applier *manifests.Applier, manifestDir, binDir string, dra bool) error {
	start := time.Now()
	namespaces := []string{metav1.NamespaceDefault}
	if dra {
		namespaces = append(namespaces, draNamespace)
	}
	total := 0
	for _, ns := range namespaces {
		set, err := applySamples(ctx, applier, filepath.Join(manifestDir, "samples"), ns)
		if err != nil {
			return err
		}
		if err := waitRunning(ctx, c.Client(), set, ns, 2*time.Minute); err != nil {
			return err
		}
		if err := waitDeployments(ctx, c.Client(), set, ns, time.Minute); err != nil {
			return err
		}
		total += set.total()
	}
	if err := waitRecorded(ctx, c.Client(), time.Minute); err != nil {
		return err
	}
	fmt.Printf("all %d sample pods Running (device-plugin pods recorded by the plugins) in %s\n", total, since(start))
	inspect := filepath.Join(binDir, inspectorBin)
	for _, args := range [][]string{nil, {"-d"}} {
		fmt.Printf("\n$ %s\n", strings.Join(append([]string{"kubectl inspect gpushare"}, args...), " "))
		cmd := exec.CommandContext(ctx, inspect, append(args, "--kubeconfig="+c.AdminKubeconfig())...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %w", inspectorBin, err)
		}
	}
	return nil
}

// sampleSet is what the demo waits for after applying manifests/samples: the Pods it applied, by
// name, and the replicas of each Deployment, which kube-controller-manager's ReplicaSets create.
type sampleSet struct {
	pods        []string
	deployments []sampleDeployment
}

type sampleDeployment struct {
	name     string
	selector labels.Selector
	replicas int32
}

// total is how many pods the samples run once every Deployment has its replicas.
func (s sampleSet) total() int {
	n := len(s.pods)
	for _, d := range s.deployments {
		n += int(d.replicas)
	}
	return n
}

// owns tells whether p is one of the samples' pods: applied by name, or matching a Deployment's
// selector.
func (s sampleSet) owns(p *corev1.Pod) bool {
	if slices.Contains(s.pods, p.Name) {
		return true
	}
	for _, d := range s.deployments {
		if d.selector.Matches(labels.Set(p.Labels)) {
			return true
		}
	}
	return false
}

// applySamples applies manifests/samples in namespace ns, as kubectl apply -k -n would: a
// Deployment's pods are then made by kube-controller-manager, like any user's.
func applySamples(ctx context.Context, a *manifests.Applier, dir, ns string) (sampleSet, error) {
	var set sampleSet
	objs, err := manifests.Load(dir)
	if err != nil {
		return set, err
	}
	for _, o := range objs {
		o.SetNamespace(ns)
		if _, err := a.Apply(ctx, o); err != nil {
			return set, err
		}
		switch o.GetKind() {
		case "Pod":
			set.pods = append(set.pods, o.GetName())
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				return set, err
			}
			sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
			if err != nil {
				return set, fmt.Errorf("Deployment %s: %w", d.Name, err)
			}
			replicas := int32(1)
			if d.Spec.Replicas != nil {
				replicas = *d.Spec.Replicas
			}
			set.deployments = append(set.deployments, sampleDeployment{name: d.Name, selector: sel, replicas: replicas})
		}
		fmt.Printf("applied %s in %s\n", manifests.Describe(o), ns)
	}
	return set, nil
}

// waitRunning watches the pods in namespace ns until every sample pod is Running, printing a line
// whenever the counts change (waitRecorded then waits for the plugins' records).
func waitRunning(ctx context.Context, client kubernetes.Interface, set sampleSet, ns string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	total := set.total()
	state := map[string]string{} // pod -> "waiting", "bound" or "Running"
	reasons := map[string]bool{} // unschedulable messages already printed
	last := ""
	lw := toolscache.NewListWatchFromClient(client.CoreV1().RESTClient(), "pods", ns, fields.Everything())
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || !set.owns(p) {
			return false, nil
		}
		switch {
		case ev.Type == watch.Deleted || p.DeletionTimestamp != nil:
			delete(state, p.Name)
		case p.Status.Phase == corev1.PodRunning:
			state[p.Name] = "Running"
		case p.Spec.NodeName != "":
			state[p.Name] = "bound"
		default:
			state[p.Name] = "waiting"
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" && !reasons[c.Message] {
					reasons[c.Message] = true
					fmt.Printf("    %s not scheduled yet: %s\n", p.Name, c.Message)
				}
			}
		}
		counts := map[string]int{}
		for _, s := range state {
			counts[s]++
		}
		line := fmt.Sprintf("  %s: %d/%d sample pods Running, %d bound (containers starting), %d waiting for the scheduler",
			ns, counts["Running"], total, counts["bound"], counts["waiting"])
		if missing := total - len(state); missing > 0 {
			line += fmt.Sprintf(", %d not created yet (kube-controller-manager makes a Deployment's pods)", missing)
		}
		if line != last {
			fmt.Println(line)
			last = line
		}
		return counts["Running"] >= total, nil
	})
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("sample pods not Running after %s (last: %s); see the logs in the cluster directory", timeout, strings.TrimSpace(last))
	}
	return err
}

// waitDeployments polls until every sample Deployment reports all its replicas ready and
// available, as kubectl get deployments then shows them.
func waitDeployments(ctx context.Context, client kubernetes.Interface, set sampleSet, ns string, timeout time.Duration) error {
	for _, want := range set.deployments {
		var d *appsv1.Deployment
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			var err error
			d, err = client.AppsV1().Deployments(ns).Get(ctx, want.name, metav1.GetOptions{})
			if err != nil {
				return false, nil // not there yet or a transient error: retried until the timeout
			}
			return d.Status.ObservedGeneration == d.Generation && d.Status.ReadyReplicas == want.replicas &&
				d.Status.AvailableReplicas == want.replicas && d.Status.UpdatedReplicas == want.replicas, nil
		})
		if err != nil {
			status := "not found"
			if d != nil {
				status = fmt.Sprintf("%d/%d ready, %d available", d.Status.ReadyReplicas, want.replicas, d.Status.AvailableReplicas)
			}
			return fmt.Errorf("Deployment %s not ready after %s (%s); see kube-controller-manager.log in the cluster directory", want.name, timeout, status)
		}
		fmt.Printf("  Deployment %s/%s: %d/%d ready\n", ns, want.name, d.Status.ReadyReplicas, want.replicas)
	}
	return nil
}

// processes are our programs, started as children that die with this process (Pdeathsig) and in
// their own process group (a terminal's Ctrl-C reaches only us; we stop them in order).
type processes struct {
	mu   sync.Mutex
	all  []*proc
	died chan *proc
}

type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
	stopping  bool
}

func (ps *processes) start(ctx context.Context, name, bin, logPath string, env []string, args ...string) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.died == nil {
		ps.died = make(chan *proc, 64)
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "==== %s start %s: %s %s\n", name, time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	ps.all = append(ps.all, p)
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.done)
		ps.mu.Lock()
		stopping := p.stopping
		ps.mu.Unlock()
		if !stopping {
			ps.died <- p
		}
	}()
	return p, nil
}

// stopAll sends SIGTERM to every process, newest first, and waits up to 10 s for each before
// killing it.
func (ps *processes) stopAll() {
	ps.mu.Lock()
	all := append([]*proc(nil), ps.all...)
	for _, p := range all {
		p.stopping = true
	}
	ps.mu.Unlock()
	for i := len(all) - 1; i >= 0; i-- {
		p := all[i]
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
}

// waitFor polls ready every 50 ms until it holds, the timeout passes, ctx ends or p exits.
func waitFor(ctx context.Context, timeout time.Duration, p *proc, what string, ready func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !ready() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not ready after %s (%w); see %s", what, timeout, ctx.Err(), p.log)
		case <-p.done:
			return fmt.Errorf("%s: %s exited; see %s", what, p.name, p.log)
		case <-tick.C:
		}
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
