"""Under the interposer (LD_PRELOAD set by ledger_cuda.sh), PyTorch's pinned host memory reaches the KFD ledger.

torch's caching host allocator calls cudaHostAlloc; a pinned tensor far past the host's RAM must fail in the
runtime and that failure must be on record (call, bytes, result) while the process goes on. No gpuwarden code here.
"""

import json
import os
import sys

import torch

status = os.environ["GPUWARDEN_STATUS_FILE"]
torch.zeros(1).cuda()
t = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
print("pinned 64 MiB:", t.is_pinned(), flush=True)
del t
torch._C._host_emptyCache()  # gives cached pinned blocks back: cudaFreeHost
try:
    torch.empty(64 << 40, dtype=torch.uint8, pin_memory=True)  # 64 TiB: no host has it
    print("64 TiB pinned?!", flush=True)
except RuntimeError as exc:
    print("64 TiB refused:", str(exc).splitlines()[0][:120], flush=True)
lines = [json.loads(x) for x in open(status) if '"host-' in x]
for d in lines:
    print(d["phase"], d.get("call"), d.get("bytes"), d.get("flags"), d.get("result"), d.get("via"),
          "pinned", d.get("pinned_bytes"), "failed", d.get("failed"))
ok = any(d["phase"] == "host-alloc" and d["call"] in ("cudaHostAlloc", "cuMemHostAlloc") for d in lines) and \
    any(d["phase"] == "host-alloc-failed" and d["bytes"] == 64 << 40 for d in lines)
print("LEDGER SAW TORCH:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
