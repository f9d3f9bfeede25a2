package slice

import "strings"

// archOf maps a product-name token to the GPU's architecture and CUDA
// compute capability, from NVIDIA's published compute-capability table
// (developer.nvidia.com/cuda-gpus). plugin/nvml does not read the
// architecture (nvmlDeviceGetArchitecture) or the capability
// (nvmlDeviceGetCudaComputeCapability) yet; this table fills them for the
// data-center GPUs gpushare targets until it does.
var archOf = map[string][2]string{
	"V100": {"Volta", "7.0"},
	"T4":   {"Turing", "7.5"},
	"A100": {"Ampere", "8.0"}, "A800": {"Ampere", "8.0"}, "A30": {"Ampere", "8.0"},
	"A10": {"Ampere", "8.6"}, "A40": {"Ampere", "8.6"}, "A16": {"Ampere", "8.6"}, "A2": {"Ampere", "8.6"},
	"L4": {"Ada Lovelace", "8.9"}, "L40": {"Ada Lovelace", "8.9"}, "L40S": {"Ada Lovelace", "8.9"}, "L20": {"Ada Lovelace", "8.9"},
	"H100": {"Hopper", "9.0"}, "H200": {"Hopper", "9.0"}, "H800": {"Hopper", "9.0"}, "H20": {"Hopper", "9.0"}, "GH200": {"Hopper", "9.0"},
	"B100": {"Blackwell", "10.0"}, "B200": {"Blackwell", "10.0"}, "GB200": {"Blackwell", "10.0"},
}

// Architecture returns the architecture and compute capability of the
// product named model ("NVIDIA H100 80GB HBM3"), matched by whole
// words with any "-" suffix cut ("A100-SXM4-40GB"); "" for both when no word
// is known.
func Architecture(model string) (arch, computeCapability string) {
	for _, word := range strings.Fields(strings.ToUpper(model)) {
		word, _, _ = strings.Cut(word, "-")
		if a, ok := archOf[word]; ok {
			return a[0], a[1]
		}
	}
	return "", ""
}
