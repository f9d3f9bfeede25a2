//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/dra"
	"github.com/gpushare/gpushare/plugin/dra/store"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/fakemps"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// draDriver is our DRA driver (plugin/dra.Run, as gpushare-device-plugin -mode=dra runs it)
// serving one hollow kubelet, whose real DRA manager registers it through the plugins registry and
// calls it over gRPC.
type draDriver struct {
	cfg     dra.Config
	cancel  context.CancelFunc
	errc    chan error
	started chan *dra.Driver
	driver  *dra.Driver
}

// startDRA runs the driver for kubelet on lib, with cfg changed by mutate (nil: none), and waits
// until it published its slice and the kubelet accepted its registration.
func startDRA(t testing.TB, client kubernetes.Interface, kubelet *cluster.Kubelet, lib nvml.Library, mutate func(*dra.Config)) *draDriver {
	t.Helper()
	cfg := dra.Config{
		Node: kubelet.Name(), Client: client, Library: lib,
		PluginDir: kubelet.PluginDataDir(gpushare.DRADriverName), RegistrarDir: kubelet.PluginsRegistryDir(),
		CDIDir: kubelet.CDISpecDir(), HealthCheck: true, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond},
		Logger: zaptest.NewLogger(t).Named(kubelet.Name()),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	d := &draDriver{cfg: cfg}
	d.start(t)
	t.Cleanup(func() { d.stop(t) })
	return d
}

// start runs the driver and waits until it serves and the kubelet registered it.
func (d *draDriver) start(t testing.TB) {
	t.Helper()
	d.errc, d.started = make(chan error, 1), make(chan *dra.Driver, 1)
	cfg := d.cfg
	cfg.Started = func(drv *dra.Driver) { d.started <- drv }
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() { d.errc <- dra.Run(ctx, cfg) }()
	select {
	case d.driver = <-d.started:
	case err := <-d.errc:
		t.Fatalf("DRA driver of %s ended before serving: %v", cfg.Node, err)
	case <-time.After(waitLong):
		t.Fatalf("DRA driver of %s did not start serving", cfg.Node)
	}
	waitFor(t, waitLong, "the kubelet of "+cfg.Node+" to register the DRA driver", func() (bool, string) {
		return d.driver.Registered(), "not registered"
	})
	waitFor(t, waitLong, "the slice of "+cfg.Node+" to be published", func() (bool, string) {
		list, err := cfg.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + cfg.Node + "," + resourceapi.ResourceSliceSelectorDriver + "=" + gpushare.DRADriverName})
		return err == nil && len(list.Items) > 0 && len(list.Items[0].Spec.Devices) > 0, fmt.Sprintf("%v", err)
	})
}

// stop ends the driver and waits for it; repeated calls are no-ops.
func (d *draDriver) stop(t testing.TB) {
	t.Helper()
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.cancel = nil
	select {
	case err := <-d.errc:
		if err != nil {
			t.Errorf("DRA driver Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("DRA driver did not stop")
	}
}

// waitFor polls cond every 50 ms until it holds, failing the test after timeout with cond's last
// explanation.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The DRA driver's ServiceAccount and admission policy, as manifests/dra names them.
const (
	draServiceAccount = "gpushare-dra-driver"
	draPolicy         = "gpushare-dra-driver"
)

// applyDRAObjects applies what manifests/dra ships but its workloads (the tests run the driver
// in-process, with its DaemonSet pod's credentials, and the webhook as a process): the
// DeviceClass, the ServiceAccounts, their ClusterRoles and bindings, and the slice admission
// policy and its binding.
func applyDRAObjects(t testing.TB, c *cluster.Cluster) {
	t.Helper()
	applyDRAObjectsOf(t, c, "dra")
}

// applyDRAObjectsOf is applyDRAObjects for the kustomization in manifests/<overlay>.
func applyDRAObjectsOf(t testing.TB, c *cluster.Cluster, overlay string) {
	t.Helper()
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.Load(filepath.Join(dir, overlay))
	if err != nil {
		t.Fatal(err)
	}
	applier, err := manifests.NewApplier(c.RESTConfig(), "gpushare-e2e")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		// The programs run in the tests, not as workloads; the webhook's configuration points at
		// a Service the bed cannot route to (TestDRAWebhook registers it with a loopback URL).
		switch o.GetKind() {
		case "DaemonSet", "Deployment", "Service", "NetworkPolicy", "MutatingWebhookConfiguration":
			continue
		}
		if o.GetKind() == "DeviceClass" && o.GetName() != gpushare.DRADeviceClassName {
			t.Fatalf("manifests/dra ships DeviceClass %q, want %q", o.GetName(), gpushare.DRADeviceClassName)
		}
		if _, err := applier.Apply(t.Context(), o); err != nil {
			t.Fatal(err)
		}
		kinds[o.GetKind()] = true
	}
	for _, k := range []string{"DeviceClass", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if !kinds[k] {
			t.Fatalf("manifests/dra ships no %s", k)
		}
	}
}

// driverClient is the DRA driver's API client on node as its DaemonSet pod has it: a token of its
// ServiceAccount bound to a pod on node, under the shipped RBAC and policy, at the client limits
// the binary ships with (--kube-api-qps 50, burst 100). At client-go's default 5 queries a second
// the kubelet plugin helper's read of each claim held every Prepare of a burst in line.
func driverClient(t testing.TB, c *cluster.Cluster, node string) kubernetes.Interface {
	t.Helper()
	path, err := c.PodTokenKubeconfig(t.Context(), "kube-system", draServiceAccount, draServiceAccount+"-"+node, node)
	if err != nil {
		t.Fatal(err)
	}
	return kubeconfigClientWithLimits(t, path, manager.DefaultKubeAPIQPS, manager.DefaultKubeAPIBurst)
}

// draBed is a cluster with the real scheduler and controller manager, the DeviceClass, and DRA
// nodes.
type draBed struct {
	c       *cluster.Cluster
	client  kubernetes.Interface
	nodes   map[string]*draNode
	claimNS string
	// kubeletAPILimits starts the kubelets at the real kubelet's API limits.
	kubeletAPILimits bool
	// recordEvents starts the kubelets posting their Events, as a real kubelet does.
	recordEvents bool
}

type draNode struct {
	kubelet *cluster.Kubelet
	gpus    []nvml.GPU
	client  kubernetes.Interface // the driver's
	driver  *draDriver
}

func startDRABed(t testing.TB) *draBed {
	t.Helper()
	c := cluster.StartT(t, cluster.Config{})
	b := &draBed{c: c, client: c.Client(), nodes: map[string]*draNode{}, claimNS: "default"}
	applyDRAObjects(t, c)
	return b
}

// addNode starts a hollow kubelet name and our driver for it on a simulator of backend.
func (b *draBed) addNode(t testing.TB, name, backend string, mutate func(*dra.Config)) *draNode {
	t.Helper()
	return b.addNodeOn(t, name, simulator(t, backend), mutate)
}

// addNodeOn starts a hollow kubelet name and our driver for it on lib, with the driver's
// DaemonSet credentials.
func (b *draBed) addNodeOn(t testing.TB, name string, lib nvml.Library, mutate func(*dra.Config)) *draNode {
	t.Helper()
	kubelet, err := b.c.AddKubelet(t.Context(), name, cluster.KubeletOptions{KubeAPILimits: b.kubeletAPILimits, RecordEvents: b.recordEvents})
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	n := &draNode{kubelet: kubelet, gpus: gpus, client: driverClient(t, b.c, name)}
	n.driver = startDRA(t, n.client, kubelet, lib, mutate)
	b.nodes[name] = n
	return n
}

// claimTemplate asks for count GPUs (0: one) with gib GiB of memory on each; with count above one,
// on distinct GPUs of one NVLink domain.
func claimTemplate(name string, gib int64, count int64) *resourceapi.ResourceClaimTemplate {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: gpushare.DRADeviceClassName,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			gpushare.DRACapacityMemory: resource.MustParse(strconv.FormatInt(gib, 10) + "Gi"),
		}},
	}}
	spec := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}
	if count > 1 {
		req.Exactly.AllocationMode, req.Exactly.Count = resourceapi.DeviceAllocationModeExactCount, count
		spec.Requests[0] = req
		spec.Constraints = []resourceapi.DeviceConstraint{
			{DistinctAttribute: ptr.To(resourceapi.FullyQualifiedName(gpushare.DRADriverName + "/" + gpushare.DRAAttributeUUID))},
			{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(gpushare.DRADriverName + "/" + gpushare.DRAAttributeNVLinkDomain))},
		}
	}
	return &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: spec}}}
}

// claimPod runs one container holding the claim made from template, on node ("" lets the
// scheduler choose).
func claimPod(name, template, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}},
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	return p
}

func (b *draBed) createTemplates(t testing.TB, tmpls ...*resourceapi.ResourceClaimTemplate) {
	t.Helper()
	for _, tmpl := range tmpls {
		if _, err := b.client.ResourceV1().ResourceClaimTemplates(b.claimNS).Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *draBed) createPods(t testing.TB, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := b.client.CoreV1().Pods(b.claimNS).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitPodsRunning waits until every named pod runs.
func (b *draBed) waitPodsRunning(t testing.TB, timeout time.Duration, names ...string) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d pods to run", len(names)), func() (bool, string) {
		var notYet []string
		for _, n := range names {
			p, err := b.client.CoreV1().Pods(b.claimNS).Get(t.Context(), n, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				notYet = append(notYet, n+" "+podState(p, err))
			}
		}
		return len(notYet) == 0, strings.Join(notYet, "; ")
	})
}

// podState says briefly where a pod is, for failure messages.
func podState(p *corev1.Pod, err error) string {
	if err != nil {
		return err.Error()
	}
	s := string(p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += " (" + string(c.Type) + ": " + c.Message + ")"
		}
	}
	return s
}

// allocation is what the scheduler allocated to a pod's claim, on our driver's devices.
type allocation struct {
	claim   *resourceapi.ResourceClaim
	node    string
	devices []string          // device names, in result order
	units   map[string]uint64 // consumed memory per device, in GiB
}

// podAllocation reads the claim the pod's "gpu" entry names and its allocation.
func (b *draBed) podAllocation(t testing.TB, pod string) allocation {
	t.Helper()
	return b.claimAllocation(t, b.claimNS, pod, "gpu")
}

// claimAllocation reads the claim the pod's entry names and its allocation.
func (b *draBed) claimAllocation(t testing.TB, ns, pod, entry string) allocation {
	t.Helper()
	p, err := b.client.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var claimName string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == entry && s.ResourceClaimName != nil {
			claimName = *s.ResourceClaimName
		}
	}
	if claimName == "" {
		t.Fatalf("pod %s names no generated claim in its status: %+v", pod, p.Status.ResourceClaimStatuses)
	}
	claim, err := b.client.ResourceV1().ResourceClaims(ns).Get(t.Context(), claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s of pod %s is not allocated", claimName, pod)
	}
	a := allocation{claim: claim, node: p.Spec.NodeName, units: map[string]uint64{}}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != gpushare.DRADriverName {
			t.Fatalf("claim %s has a result of driver %q", claimName, r.Driver)
		}
		q, ok := r.ConsumedCapacity[gpushare.DRACapacityMemory]
		if !ok {
			t.Fatalf("claim %s result %s consumes no memory: %+v", claimName, r.Device, r.ConsumedCapacity)
		}
		if r.ShareID == nil {
			t.Errorf("claim %s result %s has no shareID", claimName, r.Device)
		}
		a.devices = append(a.devices, r.Device)
		a.units[r.Device] = uint64(q.Value() >> 30)
	}
	return a
}

// publishedGPU is a device of our driver's slice: its GPU's index and memory in GiB.
type publishedGPU struct {
	index int
	gib   uint64
}

// sliceGPUs maps each device our driver publishes for node to its GPU.
func (b *draBed) sliceGPUs(t testing.TB, node string) map[string]publishedGPU {
	t.Helper()
	list, err := b.client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]publishedGPU{}
	for _, s := range list.Items {
		if s.Spec.Driver != gpushare.DRADriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		for _, d := range s.Spec.Devices {
			idx := d.Attributes[gpushare.DRAAttributeIndex].IntValue
			mem, ok := d.Capacity[gpushare.DRACapacityMemory]
			if idx == nil || !ok {
				t.Fatalf("device %s of %s's slice has no index or memory: %+v", d.Name, node, d)
			}
			out[d.Name] = publishedGPU{index: int(*idx), gib: uint64(mem.Value.Value() >> 30)}
		}
	}
	return out
}

// deviceAttribute is the string attribute name of device on node's slice ("" if absent).
func (b *draBed) deviceAttribute(t testing.TB, node, device string, name resourceapi.QualifiedName) string {
	t.Helper()
	list, err := b.client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if d.Name == device && d.Attributes[name].StringValue != nil {
				return *d.Attributes[name].StringValue
			}
		}
	}
	return ""
}

// containerOf reads fake-cri's record of the pod's container "main" on node.
func (b *draBed) containerOf(t testing.TB, node, pod string) criContainer {
	t.Helper()
	recs := criContainers(t, b.nodes[node].kubelet)[b.claimNS+"/"+pod+"/main"]
	if len(recs) != 1 {
		t.Fatalf("fake-cri on %s recorded %d containers main of pod %s, want 1", node, len(recs), pod)
	}
	return recs[0]
}

// checkClaimReachedContainer checks that the pod's container runs with exactly its claim: the
// claim's CDI device, the GPUs the scheduler allocated, and the gpushare variables for the memory
// the claim consumes. It returns the problems found.
func (b *draBed) checkClaimReachedContainer(t testing.TB, pod string, wantGiB int64) []string {
	t.Helper()
	a := b.podAllocation(t, pod)
	ctr := b.containerOf(t, a.node, pod)
	gpus := b.sliceGPUs(t, a.node)
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, pod+": "+fmt.Sprintf(format, args...))
	}
	wantDevice := gpushare.DRACDIKind + "=" + string(a.claim.UID)
	if !slices.Contains(ctr.CDIDevices, wantDevice) {
		bad("CRI CDIDevices %v lack the claim's %s", ctr.CDIDevices, wantDevice)
	}
	var indices []int
	var total uint64
	for _, d := range a.devices {
		g, ok := gpus[d]
		if !ok {
			bad("allocated device %s is not in %s's slice", d, a.node)
		}
		indices = append(indices, g.index)
		if a.units[d] != uint64(wantGiB) {
			bad("device %s consumes %d GiB, want the %d GiB asked", d, a.units[d], wantGiB)
		}
		total += a.units[d]
	}
	slices.Sort(indices) // the contract lists a container's GPUs in ascending order
	var idx []string
	for _, i := range indices {
		idx = append(idx, strconv.Itoa(i))
	}
	want := map[string]string{
		gpushare.EnvGPUIndex: strings.Join(idx, ","), gpushare.EnvVisibleDevices: strings.Join(idx, ","),
		gpushare.EnvContainerUnits: strconv.FormatUint(total, 10), gpushare.EnvPodUnits: strconv.FormatUint(total, 10),
	}
	for k, v := range want {
		if got, _ := ctr.effective(k); got != v {
			bad("runs with %s=%q, want %q", k, got, v)
		}
	}
	return problems
}

// TestDRAClaimsRun: pods whose ResourceClaimTemplates ask for 1 to 80 GiB, and claims of two and
// four GPUs of one NVLink domain (count, distinctAttribute uuid, matchAttribute nvlinkDomain), on a node of eight
// simulated H100 80GB and a mixed node (two H100 80GB, two A100 40GB), through the real
// kube-scheduler (which allocates the claims from our ResourceSlices), the controller manager
// (which makes the claims from the templates) and the kubelet's real DRA manager (which calls our
// driver's NodePrepareResources over gRPC and hands its CDI devices to the runtime): every pod
// runs, and every container, as fake-cri recorded it, carries its claim's CDI device, the GPU the
// scheduler chose, and exactly the memory the claim consumes.
func TestDRAClaimsRun(t *testing.T) {
	t.Parallel()
	b := startDRABed(t)
	b.addNode(t, "dra-h100", "simulated:dgxh100", nil)
	b.addNode(t, "dra-mixed", "simulated:mixed", nil)
	checkDRAPolicy(t, b, "dra-h100", "dra-mixed")
	sizes := []int64{1, 2, 5, 8, 13, 20, 33, 40, 64, 80}
	var names []string
	want := map[string]int64{}
	for _, gib := range sizes {
		b.createTemplates(t, claimTemplate("mem-"+strconv.FormatInt(gib, 10), gib, 0))
		for i := range 2 {
			name := fmt.Sprintf("p%d-%d", gib, i)
			b.createPods(t, claimPod(name, "mem-"+strconv.FormatInt(gib, 10), ""))
			names, want[name] = append(names, name), gib
		}
	}
	// Multi-GPU claims: count GPUs of one NVLink domain, distinct UUIDs, the memory on each.
	multi := map[string][2]int64{"pair-16": {2, 16}, "quad-10": {4, 10}}
	for tmpl, cg := range multi {
		b.createTemplates(t, claimTemplate(tmpl, cg[1], cg[0]))
		b.createPods(t, claimPod(tmpl, tmpl, ""))
		names, want[tmpl] = append(names, tmpl), cg[1]
	}
	b.waitPodsRunning(t, 3*waitLong, names...)
	for tmpl, cg := range multi {
		a := b.podAllocation(t, tmpl)
		if len(a.devices) != int(cg[0]) || len(slices.Compact(slices.Sorted(slices.Values(a.devices)))) != int(cg[0]) {
			t.Errorf("claim %s got devices %v, want %d distinct", tmpl, a.devices, cg[0])
		}
		domains := map[string]bool{}
		for _, d := range a.devices {
			domains[b.deviceAttribute(t, a.node, d, gpushare.DRAAttributeNVLinkDomain)] = true
		}
		if len(domains) != 1 || domains[""] {
			t.Errorf("claim %s got GPUs of NVLink domains %v, want one", tmpl, domains)
		}
	}
	var problems []string
	perDevice := map[string]uint64{}
	for _, n := range names {
		problems = append(problems, b.checkClaimReachedContainer(t, n, want[n])...)
		a := b.podAllocation(t, n)
		for _, d := range a.devices {
			perDevice[a.node+"/"+d] += a.units[d]
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
	// No GPU holds more than its memory: the scheduler's accounting of
	// consumable capacity, read back from the claims.
	published := map[string]publishedGPU{}
	for node := range b.nodes {
		for d, g := range b.sliceGPUs(t, node) {
			published[node+"/"+d] = g
		}
	}
	for dev, units := range perDevice {
		if units > published[dev].gib {
			t.Errorf("%s holds %d GiB of claims, more than its %d GiB", dev, units, published[dev].gib)
		}
	}
	checkInspectorDRA(t, b, published, perDevice)
}

// checkInspectorDRA runs kubectl inspect gpushare -o json against the cluster and checks that it
// shows each DRA node as one, every GPU with the memory its slice publishes and the memory its
// allocated claims consume.
func checkInspectorDRA(t *testing.T, b *draBed, published map[string]publishedGPU, held map[string]uint64) {
	t.Helper()
	code, out, errOut := inspect(t.Context(), "--kubeconfig", b.c.AdminKubeconfig(), "-o", "json")
	if code != 0 || errOut != "" {
		t.Fatalf("kubectl inspect gpushare -o json: exit %d, stderr %q", code, errOut)
	}
	var r collect.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[int][2]uint64{} // node: index: total, allocated
	for dev, g := range published {
		node, _, _ := strings.Cut(dev, "/")
		if want[node] == nil {
			want[node] = map[int][2]uint64{}
		}
		want[node][g.index] = [2]uint64{g.gib, held[dev]}
	}
	seen := 0
	for _, n := range r.Nodes {
		w, ok := want[n.Name]
		if !ok {
			continue
		}
		seen++
		if n.Mode != collect.ModeDRA || len(n.GPUs) != len(w) {
			t.Errorf("inspector shows node %s as mode %q with %d GPUs, want dra with %d", n.Name, n.Mode, len(n.GPUs), len(w))
		}
		for _, g := range n.GPUs {
			if got := [2]uint64{g.Total, g.Allocated}; got != w[g.Index] {
				t.Errorf("inspector shows %s GPU %d at %d/%d GiB, the slice and the claims say %d/%d", n.Name, g.Index, got[1], got[0], w[g.Index][1], w[g.Index][0])
			}
		}
	}
	if seen != len(want) {
		t.Errorf("inspector shows %d of the %d DRA nodes", seen, len(want))
	}
}

// TestDRAFullNodeLeavesClaimPending: eight claims of a whole H100 fill a node; a ninth stays
// pending with the scheduler's reason, and runs on the freed GPU once one pod is deleted.
func TestDRAFullNodeLeavesClaimPending(t *testing.T) {
	t.Parallel()
	b := startDRABed(t)
	b.addNode(t, "dra-full", "simulated:dgxh100", nil)
	b.createTemplates(t, claimTemplate("whole", 80, 0))
	var names []string
	for i := range 8 {
		names = append(names, fmt.Sprintf("whole-%d", i))
		b.createPods(t, claimPod(names[i], "whole", "dra-full"))
	}
	b.waitPodsRunning(t, 2*waitLong, names...)
	used := map[string]string{}
	for _, n := range names {
		a := b.podAllocation(t, n)
		if len(a.devices) != 1 {
			t.Fatalf("pod %s got devices %v, want one", n, a.devices)
		}
		if other, dup := used[a.devices[0]]; dup {
			t.Fatalf("pods %s and %s both hold the whole of %s", other, n, a.devices[0])
		}
		used[a.devices[0]] = n
	}

	b.createPods(t, claimPod("ninth", "whole", "dra-full"))
	p, err := b.c.WaitForPod(t.Context(), b.claimNS, "ninth", waitLong, "unschedulable", func(p *corev1.Pod) bool {
		return unschedulable(p) != ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if why := unschedulable(p); !strings.Contains(why, "cannot allocate all claims") {
		t.Errorf("the ninth pod is unschedulable with %q; want the scheduler's DRA reason, cannot allocate all claims", why)
	}
	t.Logf("a ninth whole-GPU claim on a full node: %s", unschedulable(p))

	freed := b.podAllocation(t, "whole-3").devices[0]
	if err := b.client.CoreV1().Pods(b.claimNS).Delete(t.Context(), "whole-3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitPodsRunning(t, 2*waitLong, "ninth")
	if got := b.podAllocation(t, "ninth").devices; !slices.Equal(got, []string{freed}) {
		t.Errorf("the ninth pod got %v; want the freed %s", got, freed)
	}
	if problems := b.checkClaimReachedContainer(t, "ninth", 80); len(problems) > 0 {
		t.Error(strings.Join(problems, "\n"))
	}
}

// claimSpecEdits reads the CDI specification our driver wrote for claim on node.
func (b *draBed) claimSpecEdits(t testing.TB, node string, claim types.UID) cdispec.ContainerEdits {
	t.Helper()
	n := b.nodes[node]
	st, err := store.New(n.driver.cfg.PluginDir, n.driver.cfg.CDIDir)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(st.SpecPath(claim))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.Devices) != 1 || spec.Devices[0].Name != string(claim) {
		t.Fatalf("the CDI specification of claim %s holds %+v, want one device named by the claim", claim, spec.Devices)
	}
	return spec.Devices[0].ContainerEdits
}

// hasMount tells whether edits bind-mount host at ctr.
func hasMount(edits cdispec.ContainerEdits, host, ctr string) bool {
	return slices.ContainsFunc(edits.Mounts, func(m *cdispec.Mount) bool { return m.HostPath == host && m.ContainerPath == ctr })
}

// TestDRATiersPerClaim: on an mps node (our MPS management driving the fake control daemon), a
// hami-core node and a node without a tier, every claim's container runs with its tier's limit
// for exactly the memory the claim consumes, set by the claim's CDI edits (applied after the
// container's own env: a pod setting the limit itself does not lift it). Then the MPS daemon is
// killed with its binary gone: a claim that requires mps stays pending with the scheduler's
// reason, and a claim allocated there anyway fails Prepare with the tier's reason in the pod's
// events, instead of running without its limit.
func TestDRATiersPerClaim(t *testing.T) {
	t.Parallel()
	b := startDRABed(t)
	b.recordEvents = true                 // the refused Prepare is read from the pod's Events
	dir, err := os.MkdirTemp("", "gsdra") // MPS pipe paths are bounded by the unix socket limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	controlBin, err := fakemps.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lib := oneGPU{simulator(t, "simulated:dgxh200")}
	devs, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	mpsPaths := isolation.Config{MPSPipeDir: filepath.Join(dir, "pipe"), MPSShmDir: filepath.Join(dir, "shm")}
	daemon := mps.New(mps.Config{ControlBin: controlBin, PipeDir: mpsPaths.MPSPipeDir, LogDir: filepath.Join(dir, "log"),
		GPUs: []string{devs[0].UUID}, Lib: lib, Logger: zaptest.NewLogger(t).Named("mps")})
	b.addNodeOn(t, "dra-mps", lib, func(c *dra.Config) {
		c.Isolation = dra.IsolationConfig{Tier: gpushare.IsolationMPS, Paths: mpsPaths, MPS: daemon, ProbeEvery: 200 * time.Millisecond}
	})
	hamiPaths := hamiFiles(t, dir)
	b.addNode(t, "dra-hami", "simulated:dgxa100", func(c *dra.Config) {
		c.Isolation = dra.IsolationConfig{Tier: gpushare.IsolationHAMiCore, Paths: hamiPaths, ProbeEvery: 200 * time.Millisecond}
	})
	b.addNode(t, "dra-none", "simulated:dgxa100", nil)
	waitFor(t, waitLong, "dra-mps to publish the mps tier", func() (bool, string) {
		return b.sliceIsolation(t, "dra-mps") == string(gpushare.IsolationMPS), "isolation " + b.sliceIsolation(t, "dra-mps")
	})

	sizes := map[string]int64{"dra-mps": 7, "dra-hami": 9, "dra-none": 5}
	var names []string
	for node, gib := range sizes {
		tmpl := "t-" + node
		b.createTemplates(t, claimTemplate(tmpl, gib, 0))
		for i := range 2 {
			p := claimPod(fmt.Sprintf("%s-%d", node, i), tmpl, node)
			if i == 1 { // a tenant's own limits, which the claim's CDI edits must override
				p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: gpushare.EnvHAMiMemoryLimit, Value: "200g"},
					{Name: gpushare.EnvMPSPinnedDeviceMemLimit, Value: "0=1000000M"}}
			}
			b.createPods(t, p)
			names = append(names, p.Name)
		}
	}
	b.waitPodsRunning(t, 2*waitLong, names...)
	for _, name := range names {
		a := b.podAllocation(t, name)
		gib := sizes[a.node]
		problems := b.checkClaimReachedContainer(t, name, gib)
		ctr := b.containerOf(t, a.node, name)
		edits := b.claimSpecEdits(t, a.node, a.claim.UID)
		mib := strconv.FormatInt(gib*1024, 10)
		expect := func(key, want string) {
			if got, _ := ctr.effective(key); got != want {
				problems = append(problems, fmt.Sprintf("%s: runs with %s=%q, want %q", name, key, got, want))
			}
		}
		absent := func(key string) {
			if got, ok := ctr.effective(key); ok {
				problems = append(problems, fmt.Sprintf("%s: runs with %s=%q on a node without that tier", name, key, got))
			}
		}
		switch a.node {
		case "dra-mps":
			expect(gpushare.EnvIsolation, string(gpushare.IsolationMPS))
			expect(gpushare.EnvMPSPinnedDeviceMemLimit, "0="+mib+"M")
			expect(gpushare.EnvCUDAVisibleDevices, devs[0].UUID)
			expect(gpushare.EnvMPSPipeDirectory, mpsPaths.MPSPipeDir)
			if !hasMount(edits, mpsPaths.MPSPipeDir, mpsPaths.MPSPipeDir) || !hasMount(edits, mpsPaths.MPSShmDir, gpushare.MPSContainerShmDir) {
				problems = append(problems, fmt.Sprintf("%s: CDI mounts %v lack the MPS pipe and shm directories", name, edits.Mounts))
			}
		case "dra-hami":
			expect(gpushare.EnvIsolation, string(gpushare.IsolationHAMiCore))
			expect(gpushare.EnvHAMiMemoryLimit, mib+"m")
			if !hasMount(edits, hamiPaths.HAMiLibrary, gpushare.HAMiContainerLibrary) || !hasMount(edits, hamiPaths.HAMiPreload, gpushare.HAMiContainerPreload) {
				problems = append(problems, fmt.Sprintf("%s: CDI mounts %v lack HAMi-core's library and preload file", name, edits.Mounts))
			}
		default:
			expect(gpushare.EnvIsolation, string(gpushare.IsolationNone))
			if !strings.HasSuffix(name, "-1") { // the tenant's own values stand where no tier limits
				absent(gpushare.EnvMPSPinnedDeviceMemLimit)
				absent(gpushare.EnvHAMiMemoryLimit)
			}
		}
		for _, p := range problems {
			t.Error(p)
		}
	}

	// A claim's compute share, as the driver's opaque parameters, reaches the MPS variable.
	compute := claimTemplate("mps-compute", 3, 0)
	compute.Spec.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: gpushare.DRADriverName, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"` + gpushare.DRAParamsAPIVersion + `","kind":"` + gpushare.DRAParamsKind + `","computePercent":30}`)}}}}}
	b.createTemplates(t, compute)
	b.createPods(t, claimPod("mps-compute", "mps-compute", "dra-mps"))
	b.waitPodsRunning(t, waitLong, "mps-compute")
	if got, _ := b.containerOf(t, "dra-mps", "mps-compute").effective(gpushare.EnvMPSActiveThreadPercentage); got != "30" {
		t.Errorf("a claim with computePercent 30 runs with %s=%q, want 30", gpushare.EnvMPSActiveThreadPercentage, got)
	}

	// Fence MPS: its daemon killed, its binary gone, so the driver cannot start it again.
	if err := os.Rename(controlBin, controlBin+".gone"); err != nil {
		t.Fatal(err)
	}
	pid, err := fakemps.ReadPID(mpsPaths.MPSPipeDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "dra-mps to publish that mps is down", func() (bool, string) {
		return b.sliceIsolation(t, "dra-mps") == string(gpushare.IsolationNone), "isolation " + b.sliceIsolation(t, "dra-mps")
	})
	needy := claimTemplate("needs-mps", 2, 0)
	needy.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes[%q].%s == %q`, gpushare.DRADriverName, gpushare.DRAAttributeIsolation, gpushare.IsolationMPS)}}}
	b.createTemplates(t, needy, claimTemplate("any-tier", 2, 0))
	b.createPods(t, claimPod("mps-after", "needs-mps", ""), claimPod("mps-node-after", "any-tier", "dra-mps"))
	p, err := b.c.WaitForPod(t.Context(), b.claimNS, "mps-after", waitLong, "unschedulable", func(p *corev1.Pod) bool {
		return unschedulable(p) != ""
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a claim that requires mps after the fence: %s", unschedulable(p))
	// The claim allocated on the fenced node anyway fails Prepare, with the reason, and never runs:
	// the kubelet posts the reason as the pod's FailedPrepareDynamicResources event.
	why := waitPodEvent(t, b.client, b.claimNS, "mps-node-after", "FailedPrepareDynamicResources")
	if !strings.Contains(why, "isolation tier unavailable") || !strings.Contains(why, `"mps", which is down`) {
		t.Errorf("Prepare refused with %q; want the mps tier's reason", why)
	}
	if p, err := b.client.CoreV1().Pods(b.claimNS).Get(t.Context(), "mps-node-after", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Errorf("the pod on the fenced node: %s; want it not running", podState(p, err))
	}
	t.Logf("a claim allocated on the fenced node: %s", why)
}

// waitPodEvent waits for an Event of reason about pod and returns its message.
func waitPodEvent(t testing.TB, client kubernetes.Interface, ns, pod, reason string) string {
	t.Helper()
	var msg string
	waitFor(t, waitLong, "event "+reason+" on pod "+pod, func() (bool, string) {
		list, err := client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + pod + ",reason=" + reason})
		if err != nil || len(list.Items) == 0 {
			return false, fmt.Sprintf("none yet (%v)", err)
		}
		msg = list.Items[0].Message
		return true, ""
	})
	return msg
}

// sliceIsolation is the isolation attribute of node's first published device ("" if none).
func (b *draBed) sliceIsolation(t testing.TB, node string) string {
	t.Helper()
	list, err := b.client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		if s.Spec.Driver == gpushare.DRADriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == node && len(s.Spec.Devices) > 0 {
			if v := s.Spec.Devices[0].Attributes[gpushare.DRAAttributeIsolation].StringValue; v != nil {
				return *v
			}
		}
	}
	return ""
}

// TestDRARestartsMidBurst: 40 pods of an 8 GiB claim on one node of eight H100 80GB, with our
// driver restarted and then the kubelet killed and started again while they start. Every pod runs
// in the end; every claim is prepared once, on the device the scheduler allocated (its container
// runs with that GPU and that memory, and the driver's checkpoint holds it with those shares);
// none is lost from the driver's checkpoint; and no GPU holds more than its memory.
func TestDRARestartsMidBurst(t *testing.T) {
	t.Parallel()
	b := startDRABed(t)
	n := b.addNode(t, "dra-restart", "simulated:dgxh100", nil)
	b.createTemplates(t, claimTemplate("eight", 8, 0))
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("burst-%02d", i))
	}
	b.createPods(t, func() []*corev1.Pod {
		var pods []*corev1.Pod
		for _, name := range names[:20] {
			pods = append(pods, claimPod(name, "eight", "dra-restart"))
		}
		return pods
	}()...)
	// The driver goes while the first pods are being prepared, and comes back.
	b.waitSomeRunning(t, names[:20], 3)
	n.driver.stop(t)
	for _, name := range names[20:30] {
		b.createPods(t, claimPod(name, "eight", "dra-restart"))
	}
	n.driver.start(t)
	// Then the kubelet dies mid-burst and starts again with the same root directory.
	b.waitSomeRunning(t, names[:30], 12)
	gap := b.watchSliceGap(t, "dra-restart")
	n.kubelet.Kill()
	for _, name := range names[30:] {
		b.createPods(t, claimPod(name, "eight", "dra-restart"))
	}
	if err := n.kubelet.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The restarted kubelet deletes the node's slices; the driver publishes again at once.
	if g := gap(); g > 5*time.Second {
		t.Errorf("the node's slice was gone %v after the kubelet's restart deleted it; want it back within seconds", g)
	} else {
		t.Logf("the kubelet's restart deleted the node's slice; the driver published it again %v later", g)
	}
	b.waitPodsRunning(t, 3*waitLong, names...)

	perDevice := map[string]uint64{}
	claims := map[types.UID]string{}
	for _, name := range names {
		for _, p := range b.checkClaimReachedContainer(t, name, 8) {
			t.Error(p)
		}
		a := b.podAllocation(t, name)
		claims[a.claim.UID] = name
		for _, d := range a.devices {
			perDevice[d] += a.units[d]
		}
	}
	for d, units := range perDevice {
		if units > 80 {
			t.Errorf("%s holds %d GiB of claims, more than its 80 GiB", d, units)
		}
	}
	st, err := store.New(n.driver.cfg.PluginDir, n.driver.cfg.CDIDir)
	if err != nil {
		t.Fatal(err)
	}
	prepared, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	for uid, pod := range claims {
		if _, ok := prepared[uid]; !ok {
			t.Errorf("the claim of running pod %s (%s) is not in the driver's checkpoint", pod, uid)
		}
	}
	for uid := range prepared {
		if _, ok := claims[uid]; !ok {
			t.Errorf("the driver's checkpoint holds claim %s, which no running pod has", uid)
		}
	}
}

// watchSliceGap watches node's slices of our driver from now; the function it returns waits for
// the next deletion of one and returns how long until one was there again.
func (b *draBed) watchSliceGap(t testing.TB, node string) func() time.Duration {
	t.Helper()
	w, err := b.client.ResourceV1().ResourceSlices().Watch(t.Context(), metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node + "," + resourceapi.ResourceSliceSelectorDriver + "=" + gpushare.DRADriverName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	// Events are timed as they arrive, not when the test gets to read them.
	gap := make(chan time.Duration, 1)
	go func() {
		var deleted time.Time
		for ev := range w.ResultChan() {
			switch {
			case ev.Type == watch.Deleted && deleted.IsZero():
				deleted = time.Now()
			case ev.Type == watch.Added && !deleted.IsZero():
				gap <- time.Since(deleted)
				return
			}
		}
	}()
	return func() time.Duration {
		t.Helper()
		select {
		case g := <-gap:
			return g
		case <-time.After(2 * waitLong):
			t.Fatalf("no deletion and re-creation of %s's slice seen", node)
		}
		return 0
	}
}

// waitSomeRunning waits until at least n of the named pods run.
func (b *draBed) waitSomeRunning(t testing.TB, names []string, n int) {
	t.Helper()
	waitFor(t, 2*waitLong, fmt.Sprintf("%d pods to run", n), func() (bool, string) {
		running := 0
		for _, name := range names {
			if p, err := b.client.CoreV1().Pods(b.claimNS).Get(t.Context(), name, metav1.GetOptions{}); err == nil && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running >= n, fmt.Sprintf("%d running", running)
	})
}

// checkDRAPolicy checks manifests/dra's admission policy on the real API server: the driver of
// node own, with its DaemonSet pod's token, is refused a slice on node other, a slice of another
// driver on its own node, and deleting other's slice; each write passes as the admin, whom the
// policy does not match (dry runs: nothing is written). Its own slice it published already.
func checkDRAPolicy(t *testing.T, b *draBed, own, other string) {
	t.Helper()
	as := b.nodes[own].client
	slice := func(driver, node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
			Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "probe"}}}}
	}
	create := func(s *resourceapi.ResourceSlice) func(kubernetes.Interface) error {
		return func(c kubernetes.Interface) error {
			_, err := c.ResourceV1().ResourceSlices().Create(t.Context(), s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}
	}
	var otherSlice string
	list, err := b.client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		if s.Spec.NodeName != nil && *s.Spec.NodeName == other {
			otherSlice = s.Name
		}
	}
	if otherSlice == "" {
		t.Fatalf("no slice of %s", other)
	}
	refused := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+draPolicy+"'")
	}
	writes := []struct {
		name string
		do   func(kubernetes.Interface) error
		want string
	}{
		{"a slice on another node", create(slice(gpushare.DRADriverName, other)), "of node " + own + " may write only the ResourceSlices of its own node"},
		{"another driver's slice on its own node", create(slice("other.example.com", own)), "only ResourceSlices of driver " + gpushare.DRADriverName},
		{"deleting another node's slice", func(c kubernetes.Interface) error {
			return c.ResourceV1().ResourceSlices().Delete(t.Context(), otherSlice, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}, "may write only the ResourceSlices of its own node"},
	}
	// The API server loads policies through informers: wait until the first refusal is the policy's.
	waitFor(t, waitLong, "the DRA slice policy to be in force", func() (bool, string) {
		err := writes[0].do(as)
		return refused(err), fmt.Sprint(err)
	})
	for _, w := range writes {
		if err := w.do(as); !refused(err) || !strings.Contains(err.Error(), w.want) {
			t.Errorf("driver of %s, %s: %v; want refused by %s with %q", own, w.name, err, draPolicy, w.want)
		}
		if err := w.do(b.client); err != nil {
			t.Errorf("%s as the admin (dry run): %v; the write itself must be valid", w.name, err)
		}
	}
}

// saturate creates a burst of claim pods of the given sizes (GiB: pods) at once, waits until all
// run, audits the claims against the GPUs, then deletes the pods and waits until their claims are
// gone.
func (b *draBed) saturate(tb testing.TB, prefix string, sizes map[int64]int) *burstTimes {
	tb.Helper()
	var pods []*corev1.Pod
	for _, gib := range slices.Sorted(maps.Keys(sizes)) {
		tmpl := fmt.Sprintf("%s-%dg", prefix, gib)
		b.createTemplates(tb, claimTemplate(tmpl, gib, 0))
		for i := range sizes[gib] {
			pods = append(pods, claimPod(fmt.Sprintf("%s-%02d-%03d", prefix, gib, i), tmpl, ""))
		}
	}
	return b.burst(tb, pods)
}

// burst creates pods at once, waits until all run, audits the claims against the GPUs, then
// deletes the pods and waits until their claims are gone.
func (b *draBed) burst(tb testing.TB, pods []*corev1.Pod) *burstTimes {
	tb.Helper()
	rec := watchBurst(tb, b.client, pods, true)
	times := rec.create(tb, b.client, pods)
	rec.wait(tb, systemWait)
	times.held = map[string]int{} // nothing holds a pod back: the scheduler allocates the claim
	b.auditClaims(tb)
	zero := int64(0)
	for _, p := range pods {
		if err := b.client.CoreV1().Pods(b.claimNS).Delete(tb.Context(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			tb.Fatal(err)
		}
	}
	waitFor(tb, 2*waitLong, "the burst's pods and claims to be gone", func() (bool, string) {
		pl, err := b.client.CoreV1().Pods(b.claimNS).List(tb.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		cl, err := b.client.ResourceV1().ResourceClaims(b.claimNS).List(tb.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(pl.Items)+len(cl.Items) == 0, fmt.Sprintf("%d pods, %d claims left", len(pl.Items), len(cl.Items))
	})
	return times
}

// auditClaims fails tb if any GPU's allocated claims consume more memory than the GPU publishes,
// or an allocated claim is on a device no slice has.
func (b *draBed) auditClaims(tb testing.TB) {
	tb.Helper()
	if missing := b.auditPublishedClaims(tb); len(missing) > 0 {
		tb.Errorf("claims are allocated on devices no slice publishes: %v", missing)
	}
}

// auditPublishedClaims fails tb if any GPU's allocated claims consume more memory than the GPU
// publishes, and returns the allocated devices no slice publishes now (node/device).
func (b *draBed) auditPublishedClaims(tb testing.TB) []string {
	tb.Helper()
	published := map[string]publishedGPU{}
	for node := range b.nodes {
		for d, g := range b.sliceGPUs(tb, node) {
			published[node+"/"+d] = g
		}
	}
	claims, err := b.client.ResourceV1().ResourceClaims(b.claimNS).List(tb.Context(), metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	held := map[string]uint64{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			q := r.ConsumedCapacity[gpushare.DRACapacityMemory]
			held[r.Pool+"/"+r.Device] += uint64(q.Value() >> 30)
		}
	}
	var missing []string
	for dev, gib := range held {
		g, ok := published[dev]
		if !ok {
			missing = append(missing, dev)
		} else if gib > g.gib {
			tb.Errorf("claims hold %d GiB of %s, which has %d GiB", gib, dev, g.gib)
		}
	}
	return missing
}

// deleteAndWaitClaimsGone deletes the pods of ns and waits until the claims made for them are gone.
func deleteAndWaitClaimsGone(t *testing.T, b *draBed, ns string, pods ...string) {
	t.Helper()
	for _, p := range pods {
		if err := b.client.CoreV1().Pods(ns).Delete(t.Context(), p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 2*waitLong, "the pods' claims to be deleted", func() (bool, string) {
		l, err := b.client.ResourceV1().ResourceClaims(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, c := range l.Items {
			for _, ref := range c.OwnerReferences {
				if slices.Contains(pods, ref.Name) {
					left = append(left, c.Name)
				}
			}
		}
		return len(left) == 0, fmt.Sprintf("claims left: %v", left)
	})
}
