package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/gpu/internal/report"
)

// claim is one claim of the check: the object the scheduler would have
// allocated, and its CDI specification's env once prepared.
type claim struct {
	obj *resourceapi.ResourceClaim
	gib int
	env []string
}

// newClaim is a claim allocated on device with gib GiB of its memory
// consumed and a share ID, as kube-scheduler allocates a consumable
// capacity (DRAConsumableCapacity).
func newClaim(gib int, device string) *claim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("claim-%dgib", gib), UID: uuid.NewUUID()}}
	share := uuid.NewUUID()
	memory := apiresource.MustParse(fmt.Sprintf("%dGi", gib))
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: gpushare.DRADriverName, Pool: nodeName, Device: device, ShareID: &share,
		ConsumedCapacity: map[resourceapi.QualifiedName]apiresource.Quantity{gpushare.DRACapacityMemory: memory},
	}}}}
	return &claim{obj: c, gib: gib}
}

func (c *claim) ref() *drapb.Claim {
	return &drapb.Claim{Namespace: c.obj.Namespace, Name: c.obj.Name, Uid: string(c.obj.UID)}
}

func refs(claims []*claim) []*drapb.Claim {
	out := make([]*drapb.Claim, len(claims))
	for i, c := range claims {
		out[i] = c.ref()
	}
	return out
}

// prepare puts the claims in the API server, prepares them in one
// NodePrepareResources over dra.sock, and reads and prints each one's CDI
// specification; it reports whether all were prepared.
func (d *driver) prepare(ctx context.Context, r *report.Report, claims []*claim) bool {
	r.Section("NodePrepareResources (dra/v1 over dra.sock)")
	for _, c := range claims {
		if _, err := d.api.ResourceV1().ResourceClaims(c.obj.Namespace).Create(ctx, c.obj, metav1.CreateOptions{}); err != nil {
			return r.Check("create "+c.obj.Name, false, report.ErrText(err, ""))
		}
	}
	resp, err := d.kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: refs(claims)})
	if !r.Check("NodePrepareResources", err == nil, report.ErrText(err, fmt.Sprintf("%d claim(s) in one call", len(claims)))) {
		return false
	}
	ok := true
	for _, c := range claims {
		ok = d.prepared(r, c, resp.Claims[string(c.obj.UID)]) && ok
	}
	return ok
}

// prepared checks one claim's answer and reads its specification.
func (d *driver) prepared(r *report.Report, c *claim, got *drapb.NodePrepareResourceResponse) bool {
	device := c.obj.Status.Allocation.Devices.Results[0].Device
	devs := got.GetDevices()
	ok := got.GetError() == "" && len(devs) == 1 && devs[0].GetDeviceName() == device
	detail := fmt.Sprintf("error %q", got.GetError())
	if ok {
		detail = fmt.Sprintf("device %s, share %s, CDI devices %s", device, devs[0].GetShareId(), strings.Join(devs[0].GetCdiDeviceIds(), " "))
	}
	if !r.Check(fmt.Sprintf("prepare %s (%d GiB)", c.obj.Name, c.gib), ok, detail) {
		return false
	}
	path := d.store.SpecPath(c.obj.UID)
	env, mounts, err := readSpec(path)
	if !r.Check("CDI specification of "+c.obj.Name, err == nil, report.ErrText(err, path)) {
		return false
	}
	c.env = env
	for _, kv := range env {
		r.Say("  env   %s", kv)
	}
	for _, m := range mounts {
		r.Say("  mount %s -> %s (%s)", m.HostPath, m.ContainerPath, strings.Join(m.Options, ","))
	}
	return true
}

// readSpec reads a claim's CDI specification: its one device's env and mounts.
func readSpec(path string) ([]string, []*cdispec.Mount, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var s cdispec.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, nil, err
	}
	if len(s.Devices) != 1 {
		return nil, nil, fmt.Errorf("%d devices in %s, want 1", len(s.Devices), path)
	}
	return s.Devices[0].ContainerEdits.Env, s.Devices[0].ContainerEdits.Mounts, nil
}

// unprepare unprepares the claims in one NodeUnprepareResources and checks
// their specifications are gone.
func (d *driver) unprepare(ctx context.Context, r *report.Report, claims []*claim) {
	r.Section("NodeUnprepareResources (dra/v1 over dra.sock)")
	resp, err := d.kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: refs(claims)})
	if !r.Check("NodeUnprepareResources", err == nil, report.ErrText(err, fmt.Sprintf("%d claim(s) in one call", len(claims)))) {
		return
	}
	for _, c := range claims {
		_, statErr := os.Stat(d.store.SpecPath(c.obj.UID))
		gone := errors.Is(statErr, fs.ErrNotExist)
		msg := resp.Claims[string(c.obj.UID)].GetError()
		r.Check("unprepare "+c.obj.Name, msg == "" && gone, fmt.Sprintf("error %q, CDI specification removed: %t", msg, gone))
	}
}

// checkMPSEnv checks a claim's specification pins its memory by ordinal 0
// on its GPU, named by UUID.
func checkMPSEnv(r *report.Report, c *claim, gpuUUID string) {
	checkEnv(r, c, gpushare.EnvMPSPinnedDeviceMemLimit, fmt.Sprintf("0=%dM", c.gib*1024))
	checkEnv(r, c, gpushare.EnvCUDAVisibleDevices, gpuUUID)
}

// checkEnv checks the claim's specification sets name to want.
func checkEnv(r *report.Report, c *claim, name, want string) {
	got, ok := lookup(c.env, name)
	if !ok {
		got = "(unset)"
	}
	r.Check(c.obj.Name+" "+name, ok && got == want, fmt.Sprintf("%s=%s, want %s", name, got, want))
}

// lookup finds name's value in env ("NAME=value").
func lookup(env []string, name string) (string, bool) {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v, true
		}
	}
	return "", false
}
