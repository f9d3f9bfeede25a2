// Command fake-cri serves the CRI fake runtime (k8s.io/cri-client/pkg/fake) on a unix socket.
// It stands where containerd stands on a real node: a separate process whose containers keep
// "running" while the kubelet restarts, so a restarted hollow-kubelet finds them, as a real kubelet
// does, and its device manager keeps their devices instead of re-admitting the pods.
//
// A container whose image name contains "exit-0" finishes with exit code 0 soon after it starts
// (the others run until stopped): tests use it for init containers that must run to completion
// before a pod's regular containers start.
//
// Every container the kubelet creates is recorded as it reached the runtime, in
// <socket's directory>/cri-containers/<container ID>.json (see containerRecord; -record-dir
// changes the directory, empty turns recording off): its labels (pod, namespace, container),
// annotations, environment in order, mounts and CDI devices, which is where a device plugin's
// Allocate answer ends up. The file is written before CreateContainer answers, atomically, and
// removed with the container.
//
// CDI devices are applied as containerd applies them (cdi.go): the devices named by the
// container's cdi.k8s.io/ annotations and its CRI CDIDevices are resolved against the CDI
// specifications in -cdi-spec-dirs (default: the directory cdi beside the socket), their env edits
// applied after the container's own environment, and CreateContainer fails when a device resolves
// to nothing. The record's effectiveEnv is the environment the container would run with.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	fakeremote "k8s.io/cri-client/pkg/fake"
	criutil "k8s.io/cri-client/pkg/util"
)

// exitMarker in an image name makes its containers finish by themselves.
const exitMarker = "exit-0"

// finishExiting ends, every period, the running containers whose image asks to: the fake runtime
// has no processes, so this is how a container "runs to completion".
func finishExiting(rs *apitest.FakeRuntimeService, period time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		rs.Lock()
		for _, c := range rs.Containers {
			if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING && c.Image != nil && strings.Contains(c.Image.Image, exitMarker) {
				c.State = runtimeapi.ContainerState_CONTAINER_EXITED
				c.FinishedAt = time.Now().UnixNano()
				c.ExitCode = 0
				c.Reason = "Completed"
			}
		}
		rs.Unlock()
	}
}

// containerRecord is what fake-cri writes for each created container: the parts of its CRI
// ContainerConfig a device plugin's Allocate answer reaches.
type containerRecord struct {
	ID          string            `json:"id"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	Envs        []keyValue        `json:"envs"` // in the kubelet's order: a later duplicate wins in a real runtime
	Mounts      []mountRecord     `json:"mounts"`
	Devices     []mountRecord     `json:"devices"`
	CDIDevices  []string          `json:"cdiDevices"`
	// InjectedCDI are the CDI devices applied, CDIDevices' first, each once (cdi.go).
	InjectedCDI []string `json:"injectedCDI"`
	// EffectiveEnv is the environment the container runs with: its own, a later value of a name
	// replacing an earlier one, then the CDI devices' env edits applied the same way.
	EffectiveEnv []keyValue `json:"effectiveEnv"`
}

type keyValue struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type mountRecord struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// recordingRuntime is the fake runtime service, applying CDI devices from the specifications in
// cdiDirs (none: CDI off, devices recorded but not applied) and recording each created container
// in dir.
type recordingRuntime struct {
	*fakeremote.RemoteRuntime
	dir     string
	cdiDirs []string
}

func (r *recordingRuntime) path(id string) string { return filepath.Join(r.dir, id+".json") }

// CreateContainer creates the container in the fake and records its configuration.
func (r *recordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	rec := containerRecord{Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations()}
	for _, e := range cfg.GetEnvs() {
		rec.Envs = append(rec.Envs, keyValue{Key: e.GetKey(), Value: string(e.GetValue())})
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	rec.EffectiveEnv = effectiveEnv(rec.Envs)
	if len(r.cdiDirs) > 0 {
		// Before the container exists, as containerd builds the OCI spec before creating it.
		devices := requestedCDIDevices(cfg.GetAnnotations(), rec.CDIDevices)
		env, err := loadCDI(r.cdiDirs).inject(rec.EffectiveEnv, devices)
		if err != nil {
			return nil, status.Errorf(codes.Unknown, "fake-cri: failed to inject CDI devices: %v", err)
		}
		rec.EffectiveEnv, rec.InjectedCDI = env, devices
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil || r.dir == "" {
		return resp, err
	}
	rec.ID = resp.ContainerId
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, mountRecord{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadonly()})
	}
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, mountRecord{ContainerPath: d.GetContainerPath(), HostPath: d.GetHostPath()})
	}
	data, err := json.Marshal(rec)
	if err == nil {
		// Write and rename, so a reader never sees half a record.
		tmp := r.path("." + resp.ContainerId)
		if err = os.WriteFile(tmp, data, 0o644); err == nil {
			err = os.Rename(tmp, r.path(resp.ContainerId))
		}
	}
	if err != nil {
		_, _ = r.RemoteRuntime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.ContainerId})
		return nil, status.Errorf(codes.Internal, "fake-cri: record container %s: %v", resp.ContainerId, err)
	}
	return resp, nil
}

// RemoveContainer removes the container and its record.
func (r *recordingRuntime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	resp, err := r.RemoteRuntime.RemoveContainer(ctx, req)
	if err == nil && r.dir != "" {
		if rerr := os.Remove(r.path(req.GetContainerId())); rerr != nil && !os.IsNotExist(rerr) {
			return nil, status.Errorf(codes.Internal, "fake-cri: remove the record of %s: %v", req.GetContainerId(), rerr)
		}
	}
	return resp, err
}

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path/to/socket to serve on (required)")
	recordDir := flag.String("record-dir", "-", "directory for the created containers' records; - means cri-containers beside the socket, empty records nothing")
	cdiDirs := flag.String("cdi-spec-dirs", "-", "comma-separated CDI specification directories, the last of highest priority; - means cdi beside the socket, empty turns CDI off")
	flag.Parse()
	if !strings.HasPrefix(*endpoint, "unix://") {
		fmt.Fprintln(os.Stderr, "fake-cri: -endpoint must be unix:///path")
		os.Exit(1)
	}
	socket := strings.TrimPrefix(*endpoint, "unix://")
	// A stale socket from a killed run would make the listen fail.
	_ = os.Remove(socket)
	dir := *recordDir
	if dir == "-" {
		dir = filepath.Join(filepath.Dir(socket), "cri-containers")
	}
	var specDirs []string
	for d := range strings.SplitSeq(*cdiDirs, ",") {
		switch d = strings.TrimSpace(d); d {
		case "":
		case "-":
			specDirs = append(specDirs, filepath.Join(filepath.Dir(socket), "cdi"))
		default:
			specDirs = append(specDirs, d)
		}
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "fake-cri:", err)
			os.Exit(1)
		}
	}
	runtime := fakeremote.NewFakeRemoteRuntime()
	// The kubelet's remote image client rejects images without a size (the in-process fake skips
	// that check): give every "pulled" image one, the size of the pause image.
	runtime.ImageService.SetFakeImageSize(300 << 10)
	// Served as fakeremote's Start serves it, with container creation recorded.
	l, err := criutil.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake-cri:", err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, &recordingRuntime{RemoteRuntime: runtime, dir: dir, cdiDirs: specDirs})
	runtimeapi.RegisterImageServiceServer(server, runtime)
	runtime.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	go server.Serve(l) //nolint:errcheck // ends with Stop below
	fmt.Println("fake-cri serving on", *endpoint)
	done := make(chan struct{})
	go finishExiting(runtime.RuntimeService, 50*time.Millisecond, done)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	close(done)
	server.Stop()
}
