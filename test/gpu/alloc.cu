// alloc: one CUDA client for test/gpu/run.sh. It allocates the given number
// of GiB (default 30) on device 0 with a single cudaMalloc and writes to all
// of it, so the memory is really backed.
//
// Exit status: 0 allocated, 2 out of memory (cudaErrorMemoryAllocation),
// 1 any other failure. Build: nvcc -O2 -o alloc alloc.cu
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

// fail reports a CUDA error and exits: 2 for out of memory, 1 otherwise.
static int fail(const char *what, cudaError_t err) {
  int code = err == cudaErrorMemoryAllocation ? 2 : 1;
  printf("RESULT %s: %s: %s (%s)\n", code == 2 ? "oom" : "error", what,
         cudaGetErrorString(err), cudaGetErrorName(err));
  return code;
}

// uuid formats a device UUID as NVML does ("GPU-xxxxxxxx-xxxx-...").
static void uuid(const cudaUUID_t &u, char *out) {
  const unsigned char *b = (const unsigned char *)u.bytes;
  sprintf(out,
          "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
          b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
          b[11], b[12], b[13], b[14], b[15]);
}

int main(int argc, char **argv) {
  double gib = argc > 1 ? atof(argv[1]) : 30;
  size_t bytes = (size_t)(gib * (double)(1ull << 30));
  cudaError_t err = cudaFree(0);  // creates the context: connects to MPS
  if (err != cudaSuccess) return fail("create context", err);

  cudaDeviceProp prop;
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
    return fail("device properties", err);
  char id[64];
  uuid(prop.uuid, id);
  size_t freeB = 0, totalB = 0;
  cudaMemGetInfo(&freeB, &totalB);
  printf("device 0: %s %s; cudaMemGetInfo free %.1f GiB of %.1f GiB\n",
         prop.name, id, freeB / 1073741824.0, totalB / 1073741824.0);

  void *p = NULL;
  if ((err = cudaMalloc(&p, bytes)) != cudaSuccess)
    return fail("cudaMalloc", err);
  if ((err = cudaMemset(p, 1, bytes)) != cudaSuccess)
    return fail("cudaMemset", err);
  if ((err = cudaDeviceSynchronize()) != cudaSuccess)
    return fail("synchronize", err);
  printf("RESULT ok: allocated and wrote %.1f GiB\n", gib);
  cudaFree(p);
  return 0;
}
