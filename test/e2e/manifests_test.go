//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/app"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// The identities of the shipped ServiceAccounts, as the API server names a ServiceAccount's token;
// a client certificate with that user name matches the shipped bindings and nothing else.
const (
	saExtender  = "system:serviceaccount:kube-system:gpushare-scheduler-extender"
	saPlugin    = "system:serviceaccount:kube-system:gpushare-device-plugin"
	saScheduler = "system:serviceaccount:kube-system:gpushare-scheduler"
)

// TestManifests applies every shipped manifest to a real API server with server-side apply, runs
// the extender and the device plugin with only the shipped RBAC, and starts the real kube-scheduler
// twice: with the shipped default-scheduler configuration, and as the shipped second scheduler
// (its configuration, arguments and RBAC). The sample multi-container pod goes through the first,
// a pod of the sample Deployment's template through the second; both must be bound by our
// extender, allocated by our plugin and Running.
func TestManifests(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := cluster.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	// No controller-manager: the test runs the shipped Deployments' and DaemonSet's programs itself,
	// and an applied Deployment must stay as applied (its status would change its resourceVersion).
	c := cluster.StartT(t, cluster.Config{BinDir: bin, NoScheduler: true, NoControllerManager: true})

	// 1. Every object of the three kustomizations is accepted, and applying again changes nothing.
	applier, err := manifests.NewApplier(c.RESTConfig(), "gpushare-e2e")
	if err != nil {
		t.Fatal(err)
	}
	var all []*unstructured.Unstructured
	for _, k := range []string{".", manifests.SecondSchedulerDir, "samples"} {
		objs, err := manifests.Load(filepath.Join(dir, k))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, objs...)
	}
	versions := map[string]string{}
	for _, o := range all {
		out, err := applier.Apply(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if out.GetUID() == "" {
			t.Fatalf("%s: the API server returned no UID", manifests.Describe(o))
		}
		versions[manifests.Describe(o)] = out.GetResourceVersion()
	}
	for _, o := range all {
		out, err := applier.Apply(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if rv := out.GetResourceVersion(); rv != versions[manifests.Describe(o)] {
			t.Errorf("%s: applying the same manifest again changed it (resourceVersion %s -> %s)", manifests.Describe(o), versions[manifests.Describe(o)], rv)
		}
	}
	t.Logf("applied %d objects", len(all))
	svc, err := c.Client().CoreV1().Services("kube-system").Get(ctx, "gpushare-scheduler-extender", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p := svc.Spec.Ports; svc.Spec.Type != corev1.ServiceTypeClusterIP || len(p) != 1 || p[0].Port != 12345 || p[0].NodePort != 0 {
		t.Errorf("extender Service %s ports %+v, want ClusterIP port 12345 and no NodePort", svc.Spec.Type, p)
	}

	// 2. The extender with only its shipped RBAC and leader election, as the shipped Deployment runs
	// it: ready means every informer listed and it holds the Lease, which it then keeps renewing.
	extDeploy, err := c.Client().AppsV1().Deployments("kube-system").Get(ctx, "gpushare-scheduler-extender", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := extDeploy.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--leader-elect") {
		t.Errorf("the shipped extender runs without --leader-elect: %q", args)
	}
	extClient := identityClient(t, c, "sa-extender", saExtender)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	extCtx, stopExt := context.WithCancel(context.Background())
	extDone := make(chan error, 1)
	// The Lease the Role names, as the program's defaults name it (the Deployment sets POD_NAMESPACE).
	election := &app.LeaderElection{Namespace: "kube-system", Name: "gpushare-scheduler-extender", Identity: "e2e-extender",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond}
	go func() {
		extDone <- app.Run(extCtx, ln, app.Config{Client: extClient, Logger: zaptest.NewLogger(t).Named("extender"), Policy: allocator.BestFit, Version: "e2e", LeaderElection: election})
	}()
	t.Cleanup(func() {
		stopExt()
		select {
		case err := <-extDone:
			if err != nil {
				t.Errorf("extender: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("extender did not stop")
		}
		// A graceful stop released the Lease (update, by name).
		l, err := c.Client().CoordinationV1().Leases("kube-system").Get(context.Background(), election.Name, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "" {
			t.Errorf("the extender's Lease after a graceful stop: %+v, %v; want released", l, err)
		}
	})
	extURL := "http://" + ln.Addr().String()
	pollUntil(t, waitLong, "extender ready (leading) with its shipped RBAC", func() bool {
		ok, _ := httpGetOK(http.DefaultClient, extURL+"/readyz")
		return ok
	})
	// Created (create), then renewed by name (get, update): the renew time moves past the acquire time.
	pollUntil(t, waitLong, "the extender's Lease held and renewed", func() bool {
		l, err := c.Client().CoordinationV1().Leases("kube-system").Get(ctx, election.Name, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == election.Identity &&
			l.Spec.AcquireTime != nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(l.Spec.AcquireTime.Time)
	})

	// 3. The device plugin with only its shipped RBAC and admission policy, with the credentials of
	// its DaemonSet's pod (a token bound to a pod on its node), once the policy is in force: it
	// patches its Node (status and annotation) and, below, its pods' records.
	kubelet, sim := startShippedPlugin(ctx, t, c, func(n *corev1.Node) bool {
		count := n.Status.Allocatable[gpushare.ResourceCount]
		return count.Value() == 4
	})

	// 4. The default scheduler with the shipped configuration (kubeconfig and extender URL rewritten).
	schedCfg, err := manifests.SchedulerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	defaultKubeconfig, err := c.Kubeconfig("default-scheduler", "system:kube-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	startSchedulerWithConfig(t, c, bin, "default-scheduler", defaultKubeconfig, schedCfg, extURL, nil)

	// 5. The second scheduler: its ConfigMap's configuration, its Deployment's arguments, its RBAC.
	secondCfg, err := manifests.SecondSchedulerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	deploy, err := c.Client().AppsV1().Deployments("kube-system").Get(ctx, manifests.SecondSchedulerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secondKubeconfig, err := c.Kubeconfig("sa-gpushare-scheduler", saScheduler)
	if err != nil {
		t.Fatal(err)
	}
	secondLog := startSchedulerWithConfig(t, c, bin, manifests.SecondSchedulerName, secondKubeconfig, secondCfg, extURL, deploy.Spec.Template.Spec.Containers[0].Args)

	// 6. The sample multi-container pod (applied above) through the default scheduler, and a pod of
	// the sample Deployment's template (no controller-manager runs here) through the second one.
	sample, err := c.Client().AppsV1().Deployments("default").Get(ctx, "gpushare-sample", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := podFromTemplate(sample, "gpushare-sample-0")
	pod.Spec.SchedulerName = manifests.SecondSchedulerName
	if _, err := c.Client().CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpushare-multi-container", "gpushare-sample-0"} {
		p, err := c.WaitForPod(ctx, "default", name, waitLong, "running and marked assigned by the device plugin", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning && p.Annotations[gpushare.AnnotationAssigned] == "true"
		})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != kubelet.Name() || p.Annotations[gpushare.AnnotationPodUnits] == "" {
			t.Errorf("pod %s: node %q, annotations %v; want bound to %s by the extender", name, p.Spec.NodeName, p.Annotations, kubelet.Name())
		}
		// The extender's shipped RBAC lets it record the bind (events.k8s.io create).
		waitEvent(t, c.Client(), "default", p.UID, gpushare.EventReasonScheduled)
	}
	if lines := grepFile(t, secondLog, "forbidden"); len(lines) > 0 {
		t.Errorf("the second scheduler was refused API calls with its shipped RBAC:\n%s", strings.Join(lines, "\n"))
	}

	// 7. The inspector's ClusterRole: nothing without it, the tables with it.
	inspectorKubeconfig, err := c.Kubeconfig("inspector-user", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := inspect(ctx, "--kubeconfig", inspectorKubeconfig); code == 0 {
		t.Errorf("inspector without the gpushare-inspector ClusterRole succeeded; stderr %q", errOut)
	}
	if _, err := c.Client().RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "gpushare-inspector-alice"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gpushare-inspector"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{}, {"-d"}, {"-d", kubelet.Name()}} {
		args = append(args, "--kubeconfig", inspectorKubeconfig)
		// RBAC changes reach the authorizer through its informer: retry until the binding is seen.
		var code int
		var out, errOut string
		pollUntil(t, waitLong, "inspector allowed by gpushare-inspector", func() bool {
			code, out, errOut = inspect(ctx, args...)
			return code == 0
		})
		if !strings.Contains(out, kubelet.Name()) || !strings.Contains(out, "Allocated") {
			t.Errorf("inspect %v: exit %d, stdout\n%s\nstderr %s", args, code, out, errOut)
		}
	}

	// 8. The plugin's shipped RBAC lets it record a GPU's health on its Node (events.k8s.io create).
	if err := sim.InjectXid(0, 62); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c.Client(), metav1.NamespaceDefault, types.UID(kubelet.Name()), gpushare.EventReasonGPUUnhealthy)
}

// identityClient is a clientset whose requests carry only the given user name (a client
// certificate: no ServiceAccount token claims, so not the device plugin's node).
func identityClient(t *testing.T, c *cluster.Cluster, name, user string) kubernetes.Interface {
	t.Helper()
	path, err := c.Kubeconfig(name, user)
	if err != nil {
		t.Fatal(err)
	}
	return kubeconfigClient(t, path)
}

// startSchedulerWithConfig runs the bed's kube-scheduler with a shipped configuration whose
// kubeconfig and extender URL are rewritten for this cluster, plus the shipped arguments (its
// --config replaced), and waits for /readyz. It returns the log path; the scheduler is stopped
// when the test ends.
func startSchedulerWithConfig(t *testing.T, c *cluster.Cluster, bin, name, kubeconfig string, config []byte, extURL string, shippedArgs []string) string {
	t.Helper()
	data, err := manifests.RewriteSchedulerConfig(config, kubeconfig, extURL+"/gpushare-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(c.Dir(), name+"-config.yaml")
	if err := os.WriteFile(configPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	args := []string{"--config=" + configPath}
	for _, a := range shippedArgs {
		if !strings.HasPrefix(a, "--config=") {
			args = append(args, a)
		}
	}
	args = append(args, "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
		"--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig)
	logPath := filepath.Join(c.Dir(), name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "kube-scheduler"), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); log.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s log (%s), last lines:\n%s", name, logPath, strings.Join(tail(grepFile(t, logPath, ""), 40), "\n"))
		}
	})
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", port)
	deadline := time.After(waitLong)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if ok, _ := httpGetOK(insecure, url); ok {
			return logPath
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s exited at start (%v); log:\n%s", name, err, strings.Join(tail(grepFile(t, logPath, ""), 40), "\n"))
		case <-deadline:
			t.Fatalf("%s not ready after %v", name, waitLong)
		case <-tick.C:
		}
	}
}

func httpGetOK(client *http.Client, url string) (bool, error) {
	resp, err := client.Get(url)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, errors.New(resp.Status)
	}
	return true, nil
}

// podFromTemplate is the pod a ReplicaSet would create from the Deployment's template.
func podFromTemplate(d *appsv1.Deployment, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.Namespace, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
		Spec:       *d.Spec.Template.Spec.DeepCopy(),
	}
}

// grepFile returns the lines of path containing substr (all lines for "").
func grepFile(t *testing.T, path, substr string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Errorf("read %s: %v", path, err)
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if strings.Contains(s.Text(), substr) {
			out = append(out, s.Text())
		}
	}
	return out
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

// startShippedPlugin adds the hollow node gpu-node and runs our device plugin there as its
// DaemonSet's pod does, with only the shipped RBAC and admission policy (once the policy is in
// force), and waits until the node advertises gpu-mem, is described by the plugin and passes more
// (nil: nothing more).
func startShippedPlugin(ctx context.Context, t *testing.T, c *cluster.Cluster, more func(*corev1.Node) bool) (*cluster.Kubelet, *nvml.Simulator) {
	t.Helper()
	kubelet, err := c.AddKubelet(ctx, "gpu-node", cluster.KubeletOptions{Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}})
	if err != nil {
		t.Fatal(err)
	}
	pluginAPI := pluginClient(t, c, kubelet.Name())
	waitPolicyInForce(t, pluginAPI, kubelet.Name())
	sim, err := nvml.NewSimulator(zaptest.NewLogger(t), "simulated:mixed")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(manager.Config{
		Node: kubelet.Name(), Client: pluginAPI, Library: sim,
		DevicePluginDir: kubelet.DevicePluginDir(), HealthCheck: true,
		Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}, Logger: zaptest.NewLogger(t).Named("plugin"),
	})
	if err != nil {
		t.Fatal(err)
	}
	plugCtx, stopPlug := context.WithCancel(context.Background())
	plugDone := make(chan error, 1)
	go func() { plugDone <- m.Run(plugCtx) }()
	t.Cleanup(func() {
		stopPlug()
		select {
		case err := <-plugDone:
			if err != nil {
				t.Errorf("device plugin: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("device plugin did not stop")
		}
		sim.Shutdown()
	})
	if _, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "advertises gpu-mem and is described by the plugin", func(n *corev1.Node) bool {
		q := n.Status.Allocatable[gpushare.ResourceName]
		return q.Value() > 0 && n.Annotations[gpushare.AnnotationNodeGPUs] != "" && (more == nil || more(n))
	}); err != nil {
		t.Fatal(err)
	}
	return kubelet, sim
}
