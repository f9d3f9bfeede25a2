// Command hollow-kubelet is kubemark's hollow kubelet (real kubelet code for node registration and
// status, pod admission, pod workers, over a fake CRI runtime) whose container manager delegates
// every device-plugin method to the real kubelet device manager (pkg/kubelet/cm/devicemanager),
// every Dynamic Resource Allocation method to the real DRA manager (pkg/kubelet/cm/dra), and
// admits pods through the real topology manager (policy none, the kubelet default), wired the way
// container_manager_linux.go wires them.
//
// A DRA driver registers through <root-dir>/plugins_registry, as on a real node (the kubelet's
// plugin manager watches it); the DRA manager then calls its NodePrepareResources and
// NodeUnprepareResources over gRPC, keeps its claim-info checkpoint in <root-dir>/dra_manager_state
// and hands the CDI device IDs the driver returns to the runtime in the container's CRI
// CDIDevices, which fake-cri records and applies.
//
// A device plugin that registers on <device-plugin-dir>/kubelet.sock is therefore dialled back,
// ListAndWatch'ed, checkpointed and asked to Allocate exactly as on a real node; its resource appears
// in the Node's capacity. It needs no root and no cgroups. Its container runtime is a fake-cri
// process (see ../fake-cri) that outlives kubelet restarts, as containerd does on a real node, and
// every file it writes (kubelet state, checkpoint, pod-resources socket) lives under -root-dir, so a
// restart with the same -root-dir behaves like a real kubelet restart: plugin sockets are wiped, the
// device checkpoint is restored, and containers still running keep their devices.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"
	_ "unsafe" // go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model" // must be devicemanager's own import: go:linkname does not type-check
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clientset "k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
	"k8s.io/kubernetes/pkg/kubemark"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// newManagerImpl is the device manager's unexported constructor. The exported NewManagerImpl
// hard-codes /var/lib/kubelet/device-plugins/kubelet.sock (a real kubelet's --root-dir does not move
// it either); this one takes the socket path, so each hollow node gets its own directory.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// checkLinkname fails when newManagerImpl is not NewManagerImpl with a socket path inserted after the
// logger: go:linkname is not type-checked, so a Kubernetes upgrade that changes it must stop here.
func checkLinkname() error {
	pub, priv := reflect.TypeOf(devicemanager.NewManagerImpl), reflect.TypeOf(newManagerImpl)
	ok := priv.NumIn() == pub.NumIn()+1 && priv.NumOut() == pub.NumOut() &&
		priv.In(0) == pub.In(0) && priv.In(1) == reflect.TypeOf("")
	for i := 1; ok && i < pub.NumIn(); i++ {
		ok = priv.In(i+1) == pub.In(i)
	}
	for i := 0; ok && i < pub.NumOut(); i++ {
		ok = priv.Out(i) == pub.Out(i)
	}
	if !ok {
		return fmt.Errorf("linkname signature %v does not match NewManagerImpl %v for this Kubernetes version", priv, pub)
	}
	return nil
}

// deviceContainerManager is the stub container manager (no cgroups) with the real device and
// topology managers behind its device-plugin methods and the real DRA manager behind its dynamic
// resource methods.
type deviceContainerManager struct {
	cm.ContainerManager
	devices  *devicemanager.ManagerImpl
	claims   *dra.Manager
	topology topologymanager.Manager
	updates  chan resourceupdates.Update
}

func (c *deviceContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc, getNode cm.GetNodeFunc,
	sourcesReady config.SourcesReady, podStatus status.PodStatusProvider, runtime internalapi.RuntimeService, localStorage bool) error {
	if err := c.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatus, runtime, localStorage); err != nil {
		return err
	}
	containers, running := containersFromRuntime(ctx, runtime)
	if err := c.devices.Start(klog.FromContext(ctx), devicemanager.ActivePodsFunc(activePods), sourcesReady, containers, running); err != nil {
		return err
	}
	// As the real container manager starts it: after the device manager, before any pod syncs.
	if err := c.claims.Start(ctx, dra.ActivePodsFunc(activePods), dra.GetNodeFunc(getNode), sourcesReady); err != nil {
		return fmt.Errorf("start the DRA manager: %w", err)
	}
	c.fanInUpdates(ctx)
	return nil
}

// fanInUpdates merges both managers' resource health updates into one channel, as the real
// container manager does.
func (c *deviceContainerManager) fanInUpdates(ctx context.Context) {
	var wg sync.WaitGroup
	for _, src := range []<-chan resourceupdates.Update{c.devices.Updates(), c.claims.Updates()} {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case u, ok := <-src:
					if !ok {
						return
					}
					select {
					case c.updates <- u:
					case <-ctx.Done():
						return
					}
				}
			}
		})
	}
	go func() { wg.Wait(); close(c.updates) }()
}

// containersFromRuntime lists the runtime's containers by pod UID and name, and which of them run.
// A real kubelet hands the same to its device manager at start: a container still running after a
// kubelet restart keeps the devices its checkpoint records instead of being admitted again (which
// would fail while its device plugin has not re-registered).
func containersFromRuntime(ctx context.Context, runtime internalapi.RuntimeService) (containermap.ContainerMap, sets.Set[string]) {
	containers, running := containermap.NewContainerMap(), sets.New[string]()
	sandboxes, err := runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		klog.FromContext(ctx).Error(err, "List pod sandboxes for the device manager")
	}
	podOf := map[string]string{}
	for _, s := range sandboxes {
		podOf[s.Id] = s.Metadata.Uid
	}
	list, err := runtime.ListContainers(ctx, nil)
	if err != nil {
		klog.FromContext(ctx).Error(err, "List containers for the device manager")
	}
	for _, ctr := range list {
		uid, ok := podOf[ctr.PodSandboxId]
		if !ok {
			continue
		}
		containers.Add(uid, ctr.Metadata.Name, ctr.Id)
		if ctr.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running.Insert(ctr.Id)
		}
	}
	return containers, running
}

func (c *deviceContainerManager) GetDevicePluginResourceCapacity(l klog.Logger) (v1.ResourceList, v1.ResourceList, []string) {
	return c.devices.GetCapacity(l)
}

func (c *deviceContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	return map[string]cache.PluginHandler{
		pluginwatcherapi.DevicePlugin: c.devices.GetWatcherHandler(),
		pluginwatcherapi.DRAPlugin:    c.claims.GetWatcherHandler(),
	}
}

// GetResources is what the container runs with: its claims' CDI devices first, then the device
// plugins' answer, in the real container manager's order.
func (c *deviceContainerManager) GetResources(ctx context.Context, pod *v1.Pod, ctr *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts := &kubecontainer.RunContainerOptions{}
	claimed, err := c.claims.GetResources(pod, ctr)
	if err != nil {
		return nil, err
	}
	opts.CDIDevices = append(opts.CDIDevices, claimed.CDIDevices...)
	d, err := c.devices.GetDeviceRunContainerOptions(ctx, pod, ctr)
	if err != nil || d == nil {
		return opts, err
	}
	opts.Devices, opts.Mounts, opts.Envs, opts.Annotations = d.Devices, d.Mounts, d.Envs, d.Annotations
	opts.CDIDevices = append(opts.CDIDevices, d.CDIDevices...)
	return opts, nil
}

func (c *deviceContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return c.claims.PrepareResources(ctx, pod)
}

func (c *deviceContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return c.claims.UnprepareResources(ctx, pod)
}

func (c *deviceContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return c.claims.PodMightNeedToUnprepareResources(uid)
}

func (c *deviceContainerManager) UpdatePluginResources(n *schedulerframework.NodeInfo, a *lifecycle.PodAdmitAttributes) error {
	return c.devices.UpdatePluginResources(n, a)
}

func (c *deviceContainerManager) GetAllocateResourcesPodAdmitHandler(klog.Logger) lifecycle.PodAdmitHandler {
	return c.topology
}

func (c *deviceContainerManager) ShouldResetExtendedResourceCapacity() bool {
	return c.devices.ShouldResetExtendedResourceCapacity()
}

func (c *deviceContainerManager) UpdateAllocatedDevices(l klog.Logger) {
	c.devices.UpdateAllocatedDevices(l)
}

func (c *deviceContainerManager) UpdateAllocatedResourcesStatus(l klog.Logger, p *v1.Pod, s *v1.PodStatus) {
	c.devices.UpdateAllocatedResourcesStatus(l, p, s)
	c.claims.UpdateAllocatedResourcesStatus(l, p, s)
}

func (c *deviceContainerManager) Updates() <-chan resourceupdates.Update { return c.updates }

func (c *deviceContainerManager) GetDevices(podUID, ctr string) []*podresourcesapi.ContainerDevices {
	return podResourceDevices(c.devices.GetDevices(podUID, ctr))
}

func (c *deviceContainerManager) GetAllocatableDevices(l klog.Logger) []*podresourcesapi.ContainerDevices {
	return podResourceDevices(c.devices.GetAllocatableDevices(l))
}

func podResourceDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for res, m := range devs {
		for id := range m {
			out = append(out, &podresourcesapi.ContainerDevices{ResourceName: res, DeviceIds: []string{id}})
		}
	}
	return out
}

type options struct {
	kubeconfig  string
	name        string
	rootDir     string
	pluginDir   string
	port        int
	maxPods     int
	statusEvery time.Duration
	realLimits  bool
	labels      string
	cri         string
	events      bool
}

func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q is not key=value", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

func main() {
	klog.InitFlags(nil)
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the node identity (CN=system:node:<name>)")
	flag.StringVar(&o.name, "name", "hollow-0", "node name")
	flag.StringVar(&o.rootDir, "root-dir", "", "kubelet root dir (required); all state lives below it")
	flag.StringVar(&o.pluginDir, "device-plugin-dir", "", "where kubelet.sock is served (default <root-dir>/device-plugins)")
	flag.IntVar(&o.port, "kubelet-port", 10250, "kubelet API port on 127.0.0.1")
	flag.IntVar(&o.maxPods, "max-pods", 110, "max pods")
	flag.BoolVar(&o.realLimits, "kube-api-limits", false, "run the API client at the kubelet's kubeAPIQPS and kubeAPIBurst (50, 100) instead of client-go's 5 and 10")
	flag.DurationVar(&o.statusEvery, "node-status-update-frequency", 2*time.Second,
		"how often node status (device-plugin capacity included) is pushed; a real kubelet uses 10s")
	flag.StringVar(&o.labels, "node-labels", "", "labels the node registers with, k=v[,k=v]")
	flag.StringVar(&o.cri, "container-runtime-endpoint", "", "CRI endpoint (unix:///path), e.g. a fake-cri process (required)")
	flag.BoolVar(&o.events, "record-events", false, "post the kubelet's Events to the API server (a real kubelet's recorder, at its eventRecordQPS 50, burst 100) instead of kubemark's recorder, which drops them")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "hollow-kubelet:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if err := checkLinkname(); err != nil {
		return err
	}
	if o.rootDir == "" || o.cri == "" {
		return fmt.Errorf("-root-dir and -container-runtime-endpoint are required")
	}
	if o.pluginDir == "" {
		o.pluginDir = filepath.Join(o.rootDir, "device-plugins")
	}
	labels, err := parseLabels(o.labels)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	logger := klog.FromContext(ctx)

	restConfig, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	restConfig.UserAgent = "hollow-kubelet"
	flags, kc := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName: o.name, KubeletPort: o.port, MaxPods: o.maxPods, NodeLabels: labels,
	})
	// -kube-api-limits: the kubelet's API client limits (kubeAPIQPS 50, kubeAPIBurst 100 by
	// default), as the real kubelet sets them. Left at client-go's 5 and 10, pod status updates
	// queue behind each other and a node shows about 2 pods/s reaching Running, whatever our plugin
	// does; the saturating burst measures with them. The tests keep the slower default for now: a
	// kubelet this fast re-admits pods after a restart before any device plugin has registered
	// again and refuses them ("no healthy devices present"), which TestSystemKubeletRestart does
	// not tolerate yet.
	if o.realLimits {
		restConfig.QPS, restConfig.Burst = float32(kc.KubeAPIQPS), int(kc.KubeAPIBurst)
	}
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	// GetHollowKubeletConfig always makes a /tmp/hollow-kubelet.* tree: keep everything under -root-dir.
	if flags.RootDirectory != o.rootDir {
		_ = os.RemoveAll(flags.RootDirectory)
	}
	flags.RootDirectory = o.rootDir
	kc.StaticPodPath = filepath.Join(o.rootDir, "static-pods")
	kc.PodLogsDir = filepath.Join(o.rootDir, "pod-logs")
	kc.Address = "127.0.0.1"
	kc.HealthzPort = 0
	kc.NodeStatusUpdateFrequency.Duration = o.statusEvery
	for _, d := range []string{kc.StaticPodPath, kc.PodLogsDir, o.pluginDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	heartbeatConfig := *restConfig
	heartbeatConfig.Timeout = o.statusEvery
	heartbeatConfig.QPS = -1
	heartbeat, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return err
	}

	topology, err := topologymanager.NewManager(logger, nil, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return err
	}
	devices, err := newManagerImpl(logger, filepath.Join(o.pluginDir, "kubelet.sock"), nil, topology)
	if err != nil {
		return err
	}
	topology.AddHintProvider(logger, devices)
	// The claim-info checkpoint lives in the kubelet's root directory, as nodeConfig.KubeletRootDir
	// places it on a real node.
	claims, err := dra.NewManager(logger, client, o.rootDir)
	if err != nil {
		return err
	}
	defer claims.Stop()
	containers := &deviceContainerManager{ContainerManager: cm.NewStubContainerManager(), devices: devices, claims: claims,
		topology: topology, updates: make(chan resourceupdates.Update, 100)}

	runtimeService, err := remote.NewRemoteRuntimeService(ctx, o.cri, 15*time.Second, nil, false)
	if err != nil {
		return err
	}
	imageService, err := remote.NewRemoteImageService(ctx, o.cri, 15*time.Second, nil, false)
	if err != nil {
		return err
	}
	fmt.Printf("hollow-kubelet node=%s root=%s device-plugin-socket=%s\n", o.name, o.rootDir, filepath.Join(o.pluginDir, "kubelet.sock"))
	kubelet := kubemark.NewHollowKubelet(flags, kc, client, heartbeat, &cadvisortest.Fake{NodeName: o.name},
		imageService, runtimeService, containers)
	if o.events {
		recorder, err := eventRecorder(ctx, restConfig, o.name)
		if err != nil {
			return err
		}
		kubelet.KubeletDeps.Recorder = recorder
	}
	go kubelet.Run(ctx)
	<-ctx.Done()
	return nil
}

// eventRecorder is the recorder a real kubelet makes (cmd/kubelet's makeEventRecorder): Events of
// component kubelet from host node, posted through a client of their own at the kubelet's default
// eventRecordQPS (50) and eventBurst (100).
func eventRecorder(ctx context.Context, restConfig *rest.Config, node string) (record.EventRecorderLogger, error) {
	cfg := *restConfig
	cfg.QPS, cfg.Burst = 50, 100
	client, err := clientset.NewForConfig(&cfg)
	if err != nil {
		return nil, err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return broadcaster.NewRecorder(legacyscheme.Scheme, v1.EventSource{Component: "kubelet", Host: node}), nil
}
