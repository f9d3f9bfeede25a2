package gpushare

// Bounds shared by every decoder. They reject absurd values early so that
// consumers can index slices by GPU index and sum units without overflow.
const (
	// MaxGPUsPerNode bounds GPU indices to [0, MaxGPUsPerNode) and the GPU count of a node;
	// today's largest nodes carry 16 GPUs.
	MaxGPUsPerNode = 64
	// MaxUnits bounds every units value read here (a request, a GPU size, a pod total):
	// 1<<20 is 1 TiB in MiB units, beyond any GPU.
	MaxUnits uint64 = 1 << 20
)
