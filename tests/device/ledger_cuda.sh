#!/usr/bin/env bash
# The KFD ledger on an NVIDIA node: (1) the interposer's cost per pinned allocation/free against the real
# cudaHostAlloc/cudaFreeHost, same program with and without LD_PRELOAD, 5 rounds; (2) the stand-in benchmark of
# tests/bench/bench_preload.py's `pinned` mode on this quieter machine; (3) PyTorch's pinned memory recorded
# (tests/device/ledger_cuda.py). Touches no GPU setting; pins at most 64 MiB of host memory at a time.
source tests/device/setup.sh
set -uo pipefail
T=$(mktemp -d)
LIB=$PWD/ops/engines/libgwpreload.so
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
CUDART=$(python3 -c 'import torch; torch.zeros(1).cuda(); print(next(l.split()[-1] for l in open("/proc/self/maps") if "libcudart" in l))')
echo "cudart: $CUDART"
cc -O2 -o "$T/rb" tests/bench/pinned_real_bench.c -ldl || exit 2
for size in 4096 2097152; do
    n=$([ $size = 4096 ] && echo 20000 || echo 2000)
    for r in 1 2 3 4 5; do
        peer=$("$T/rb" "$CUDART" cudaHostAlloc cudaFreeHost $n $size)
        ours=$(LD_PRELOAD=$LIB GPUWARDEN_STATUS_FILE=$T/real-$size-$r.jsonl "$T/rb" "$CUDART" cudaHostAlloc cudaFreeHost $n $size)
        echo "real cudaHostAlloc+cudaFreeHost $size B round $r: peer $peer ours $ours"
    done
done
echo "lines written at 2 MiB, round 1: $(grep -c host-alloc "$T/real-2097152-1.jsonl")"
printf 'hip_4.2 {\n  global: *;\n};\n' > "$T/hip.map"
cc -O1 -fPIC -shared -Wl,-soname,libamdhip64.so -Wl,--version-script,"$T/hip.map" -o "$T/libamdhip64.so" \
    tests/standins/preload/standin_hip.c
cc -O2 -o "$T/pb" tests/bench/preload_bench.c -Wl,-rpath,"$T" -L"$T" -lamdhip64
for r in 1 2 3 4 5; do
    echo "stand-in hipHostMalloc+hipHostFree 4 KiB round $r: peer $(STANDIN_REGISTER_MS=0 "$T/pb" pinned 2000000 4096)" \
         "ours $(STANDIN_REGISTER_MS=0 LD_PRELOAD=$LIB GPUWARDEN_STATUS_FILE=$T/s.jsonl "$T/pb" pinned 2000000 4096)"
done
LD_PRELOAD=$LIB GPUWARDEN_STATUS_FILE=$T/torch.jsonl python3 tests/device/ledger_cuda.py
