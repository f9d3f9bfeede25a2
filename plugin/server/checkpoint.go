package server

import (
	"encoding/json"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// CheckpointAnswer is one container's answer as the kubelet's device-manager
// checkpoint keeps it.
type CheckpointAnswer struct {
	PodUID, ContainerName string
	Response              *pluginapi.ContainerAllocateResponse
}

// ReadCheckpointAnswers reads the kubelet's device-manager checkpoint at
// path (pkg/kubelet/cm/devicemanager/checkpoint, whose AllocResp is a
// marshalled ContainerAllocateResponse) and returns every container's
// answer, whatever its resource.
func ReadCheckpointAnswers(path string) ([]CheckpointAnswer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Data *struct {
			PodDeviceEntries []struct {
				PodUID        string
				ContainerName string
				AllocResp     []byte
			}
		}
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if f.Data == nil {
		return nil, fmt.Errorf("parse %s: no Data", path)
	}
	out := make([]CheckpointAnswer, 0, len(f.Data.PodDeviceEntries))
	for _, e := range f.Data.PodDeviceEntries {
		var resp pluginapi.ContainerAllocateResponse
		if err := proto.Unmarshal(e.AllocResp, &resp); err != nil {
			return nil, fmt.Errorf("parse %s: allocation of %s/%s: %w", path, e.PodUID, e.ContainerName, err)
		}
		out = append(out, CheckpointAnswer{PodUID: e.PodUID, ContainerName: e.ContainerName, Response: &resp})
	}
	return out, nil
}
