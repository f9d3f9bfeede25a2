package gpushare_test

import (
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// TestContractNames pins every name to the text of the contract: running
// clusters depend on these exact strings, so a change must fail loudly.
func TestContractNames(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{string(gpushare.ResourceName), "aliyun.com/gpu-mem"},
		{string(gpushare.ResourceCount), "aliyun.com/gpu-count"},
		{gpushare.AnnotationGPUIndex, "ALIYUN_COM_GPU_MEM_IDX"},
		{gpushare.AnnotationPodUnits, "ALIYUN_COM_GPU_MEM_POD"},
		{gpushare.AnnotationDevUnits, "ALIYUN_COM_GPU_MEM_DEV"},
		{gpushare.AnnotationAssigned, "ALIYUN_COM_GPU_MEM_ASSIGNED"},
		{gpushare.AnnotationAssumeTime, "ALIYUN_COM_GPU_MEM_ASSUME_TIME"},
		{gpushare.AnnotationAllocation, "scheduler.framework.gpushare.allocation"},
		{gpushare.AnnotationNodeGPUs, "gpushare.io/gpus"},
		{gpushare.EnvVisibleDevices, "NVIDIA_VISIBLE_DEVICES"},
		{gpushare.EnvGPUIndex, "ALIYUN_COM_GPU_MEM_IDX"},
		{gpushare.EnvPodUnits, "ALIYUN_COM_GPU_MEM_POD"},
		{gpushare.EnvContainerUnits, "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{gpushare.EnvDevUnits, "ALIYUN_COM_GPU_MEM_DEV"},
		{gpushare.EnvDisableIsolation, "CGPU_DISABLE"},
		{gpushare.EnvNodeName, "NODE_NAME"},
		{gpushare.LabelGPUShare, "gpushare"},
		{gpushare.LabelDisableIsolation, "cgpu.disable.isolation"},
		{gpushare.LabelValueTrue, "true"},
		{gpushare.UnhealthyConfigMapNamespace, "kube-system"},
		{gpushare.UnhealthyConfigMapPrefix, "unhealthy-gpu-"},
		{gpushare.UnhealthyConfigMapKey, "gpus"},
		{gpushare.DevicePluginSocket, "aliyungpushare.sock"},
		{gpushare.DevicePluginDir, "/var/lib/kubelet/device-plugins"},
		{gpushare.ExtenderURLPrefix, "/gpushare-scheduler"},
	} {
		if tt.got != tt.want {
			t.Errorf("name %q; contract says %q", tt.got, tt.want)
		}
	}
}

func TestNodeHelpers(t *testing.T) {
	if got := gpushare.UnhealthyConfigMapName("node-a"); got != "unhealthy-gpu-node-a" {
		t.Errorf("UnhealthyConfigMapName = %q", got)
	}
	for _, tt := range []struct {
		labels        map[string]string
		share, isoOff bool
	}{
		{nil, false, false},
		{map[string]string{"gpushare": "true"}, true, false},
		{map[string]string{"gpushare": "True", "cgpu.disable.isolation": "yes"}, false, false},
		{map[string]string{"gpushare": "true", "cgpu.disable.isolation": "true"}, true, true},
	} {
		if gpushare.IsGPUShareNode(tt.labels) != tt.share || gpushare.IsolationDisabled(tt.labels) != tt.isoOff {
			t.Errorf("labels %v: share=%v isolationDisabled=%v", tt.labels, gpushare.IsGPUShareNode(tt.labels), gpushare.IsolationDisabled(tt.labels))
		}
	}
}
