"""alloc.py: the PyTorch stand-in for alloc.cu, used by test/gpu/run.sh when
nvcc is missing. Allocates the given GiB (default 30) on cuda:0 in one tensor
and writes to it. Exit status: 0 allocated, 2 out of memory, 1 otherwise."""
import sys

import torch


def main():
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    try:
        free, total = torch.cuda.mem_get_info(0)
        print(f"device 0: {torch.cuda.get_device_name(0)}; "
              f"mem_get_info free {free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB")
        x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda:0")
        x.fill_(1)
        torch.cuda.synchronize()
    except Exception as e:  # torch.cuda.OutOfMemoryError and other CUDA errors
        oom = "out of memory" in str(e).lower()
        print(f"RESULT {'oom' if oom else 'error'}: {e}")
        return 2 if oom else 1
    print(f"RESULT ok: allocated and wrote {gib:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
