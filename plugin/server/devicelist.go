package server

import (
	"fmt"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// DeviceList says how an Allocate answer names the container's GPU to the
// container runtime: the device plugin's --device-list-strategy and
// --device-id-strategy. The zero value is the envvar strategy (the old
// gpushare's answer) with GPUs named by UUID wherever the ID strategy applies.
type DeviceList struct {
	Strategies gpushare.DeviceListStrategies // empty means envvar
	IDs        gpushare.DeviceIDStrategy     // empty means uuid; envvar always writes the index
	// Limits is the plugin's CDI specification, through which the CDI
	// strategies hand an isolation tier's variables to the runtime
	// (ContainerResponseWith). Required for an answer with a tier's
	// variables under a CDI strategy; unused otherwise.
	Limits *LimitSpecs
}

// String describes d for logs, e.g. "volume-mounts (GPUs by uuid)" or
// "cdi-cri (GPUs by uuid, limits in /var/run/cdi/gpushare.io-limits.json)".
func (d DeviceList) String() string {
	out := d.Strategies.String() + " (GPUs by " + string(d.ids())
	if d.cdi() && d.Limits != nil {
		out += ", limits in " + d.Limits.Path()
	}
	return out + ")"
}

// cdi reports whether a CDI strategy names the GPU.
func (d DeviceList) cdi() bool {
	return d.Strategies.Includes(gpushare.DeviceListCDIAnnotations) || d.Strategies.Includes(gpushare.DeviceListCDICRI)
}

func (d DeviceList) ids() gpushare.DeviceIDStrategy {
	if d.IDs == "" {
		return gpushare.DeviceIDUUID
	}
	return d.IDs
}

// ContainerResponse is the answer for one container given env on the GPUs
// of UUIDs uuids (env.Set()'s order: one, or each of a multi-GPU container's). Whatever the strategies, the gpushare variables (env.Map(), the
// contract) are all there; what changes is how the GPU reaches the runtime:
//
//   - envvar: NVIDIA_VISIBLE_DEVICES=<index> (<i>,<j> for several GPUs), as
//     the old gpushare.
//   - volume-mounts: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices
//     and /dev/null mounted at /var/run/nvidia-container-devices/<id>, one per GPU
//     (NVIDIA's plugin does the same, and with both envvar and volume-mounts
//     the mount wins the variable, as there).
//   - cdi-annotations: annotation cdi.k8s.io/gpushare-device-plugin_<index>
//     = nvidia.com/gpu=<id>, one per GPU.
//   - cdi-cri: CDIDevices [nvidia.com/gpu=<id>], one per GPU.
//
// With only CDI strategies NVIDIA_VISIBLE_DEVICES is "void" (NVIDIA's plugin
// leaves it unset and its CDI specifications set void): an image's
// NVIDIA_VISIBLE_DEVICES=all then adds nothing through the NVIDIA runtime's
// hook. <id> is the GPU's UUID or its index, by d.IDs. An empty uuid where a
// UUID is needed, or not one uuid per GPU, is an error: never a response
// naming no GPU.
func (d DeviceList) ContainerResponse(env gpushare.ContainerEnv, uuids []string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{Envs: env.Map()}
	s := d.Strategies
	mounts := s.Includes(gpushare.DeviceListVolumeMounts)
	annotations, cri := s.Includes(gpushare.DeviceListCDIAnnotations), s.Includes(gpushare.DeviceListCDICRI)
	if !mounts && !annotations && !cri {
		return resp, nil // envvar alone: env.Map() is the answer
	}
	gpus := env.Set().Indices()
	if len(uuids) != len(gpus) {
		return nil, fmt.Errorf("%d UUIDs for the %d GPUs %s", len(uuids), len(gpus), env.Set())
	}
	switch {
	case mounts:
		resp.Envs[gpushare.EnvVisibleDevices] = gpushare.DeviceListMountDir
	case s.OnlyCDI():
		resp.Envs[gpushare.EnvVisibleDevices] = gpushare.VisibleDevicesVoid
	}
	for k, g := range gpus {
		id, err := d.id(g, uuids[k])
		if err != nil {
			return nil, err
		}
		if mounts {
			resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: gpushare.DeviceListMountPath(id), HostPath: gpushare.DeviceListMountHostPath})
		}
		if annotations {
			if resp.Annotations == nil {
				resp.Annotations = map[string]string{}
			}
			resp.Annotations[gpushare.CDIAnnotationKey(g)] = gpushare.CDIDeviceName(id)
		}
		if cri {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: gpushare.CDIDeviceName(id)})
		}
	}
	return resp, nil
}

// ContainerResponseWith is ContainerResponse with an isolation tier's answer
// (isolation.For) composed in: its variables join the strategy's, its mounts
// follow the strategy's. The two never name the same variable or container
// path; if they did, one would silently undo the other (a device mount, or
// a memory limit), so that is an error.
//
// Under a CDI strategy the tier's variables also go to the runtime as the
// container edits of a CDI device of the plugin's own (d.Limits.Ensure, a
// device per set of variables, gpushare.CDILimitsDeviceName), named beside
// the GPU's: in CDIDevices for cdi-cri, in the annotation
// gpushare.CDILimitsAnnotationKey for cdi-annotations. The kubelet puts the
// answer's variables before the container's own env, where a container's
// value of the same name wins; a CDI runtime applies the device's edits
// after the container's env, so the tier's values win. The variables stay in
// the answer's env too (the kubelet's checkpoint, the record checks). When
// the specification cannot be written, or there is none to write, it is an
// error: never an answer whose limit the container could lift.
func (d DeviceList) ContainerResponseWith(env gpushare.ContainerEnv, uuids []string, tier isolation.Answer) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := d.ContainerResponse(env, uuids)
	if err != nil {
		return nil, err
	}
	for k, v := range tier.Envs {
		if _, dup := resp.Envs[k]; dup {
			return nil, fmt.Errorf("the isolation tier's variable %s is already in the answer", k)
		}
		resp.Envs[k] = v
	}
	if len(tier.Envs) > 0 && d.cdi() {
		if err := d.addLimitsDevice(resp, env.Isolation, tier.Envs); err != nil {
			return nil, err
		}
	}
	paths := make(map[string]bool, len(resp.Mounts))
	for _, m := range resp.Mounts {
		paths[m.ContainerPath] = true
	}
	for _, m := range tier.Mounts {
		if paths[m.ContainerPath] {
			return nil, fmt.Errorf("the isolation tier's mount at %s is already in the answer", m.ContainerPath)
		}
		paths[m.ContainerPath] = true
		resp.Mounts = append(resp.Mounts, m)
	}
	return resp, nil
}

// addLimitsDevice ensures the limits device for the tier's variables envs is
// in the specification and names it in resp by d's CDI strategies.
func (d DeviceList) addLimitsDevice(resp *pluginapi.ContainerAllocateResponse, tier gpushare.Isolation, envs map[string]string) error {
	if d.Limits == nil {
		return fmt.Errorf("isolation tier %s under device-list strategy %s: no CDI spec directory to hand its limits to the runtime", tier, d.Strategies)
	}
	edits := gpushare.CDILimitsEnv(envs)
	name := gpushare.CDILimitsDeviceName(tier, edits)
	if err := d.Limits.Ensure(name, edits); err != nil {
		return fmt.Errorf("isolation tier %s: its limits cannot reach the runtime as CDI device %s: %w", tier, gpushare.CDILimitsDevice(name), err)
	}
	q := gpushare.CDILimitsDevice(name)
	if d.Strategies.Includes(gpushare.DeviceListCDIAnnotations) {
		if resp.Annotations == nil {
			resp.Annotations = map[string]string{}
		}
		resp.Annotations[gpushare.CDILimitsAnnotationKey] = q
	}
	if d.Strategies.Includes(gpushare.DeviceListCDICRI) {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: q})
	}
	return nil
}

// id names the GPU of index index and UUID uuid by d's ID strategy.
func (d DeviceList) id(index int, uuid string) (string, error) {
	if d.ids() == gpushare.DeviceIDIndex {
		return strconv.Itoa(index), nil
	}
	if uuid == "" {
		return "", fmt.Errorf("GPU %d has no UUID to name it by (--device-id-strategy=uuid)", index)
	}
	return uuid, nil
}
