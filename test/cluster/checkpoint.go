package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Checkpoint is what the kubelet's device manager persisted: the devices it knows per resource and
// what every container was given. It is the ground truth of what a container would run with.
type Checkpoint struct {
	Entries           []CheckpointEntry
	RegisteredDevices map[string][]string
}

// CheckpointEntry is one container's allocation of one resource.
type CheckpointEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	// DeviceIDs are sorted.
	DeviceIDs []string
	// Envs is the environment the device plugin's Allocate answered with.
	Envs map[string]string
	// Mounts are the mounts it answered with.
	Mounts []*pluginapi.Mount
}

// checkpointFile mirrors the kubelet's checkpoint JSON (pkg/kubelet/cm/devicemanager/checkpoint).
type checkpointFile struct {
	Data struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			DeviceIDs     map[string][]string // NUMA node -> IDs
			AllocResp     []byte              // a marshalled ContainerAllocateResponse
		}
		RegisteredDevices map[string][]string
	}
}

// Checkpoint reads the kubelet's device checkpoint.
func (k *Kubelet) Checkpoint() (Checkpoint, error) { return ReadCheckpoint(k.CheckpointPath()) }

// ReadCheckpoint parses a kubelet_internal_checkpoint file.
func ReadCheckpoint(path string) (Checkpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Checkpoint{}, err
	}
	var f checkpointFile
	if err := json.Unmarshal(data, &f); err != nil {
		return Checkpoint{}, fmt.Errorf("parse %s: %w", path, err)
	}
	cp := Checkpoint{RegisteredDevices: f.Data.RegisteredDevices}
	for _, e := range f.Data.PodDeviceEntries {
		entry := CheckpointEntry{PodUID: e.PodUID, ContainerName: e.ContainerName, ResourceName: e.ResourceName}
		for _, ids := range e.DeviceIDs {
			entry.DeviceIDs = append(entry.DeviceIDs, ids...)
		}
		sort.Strings(entry.DeviceIDs)
		var resp pluginapi.ContainerAllocateResponse
		if err := proto.Unmarshal(e.AllocResp, &resp); err != nil {
			return Checkpoint{}, fmt.Errorf("parse %s: allocation of %s/%s: %w", path, e.PodUID, e.ContainerName, err)
		}
		entry.Envs, entry.Mounts = resp.Envs, resp.Mounts
		cp.Entries = append(cp.Entries, entry)
	}
	return cp, nil
}
