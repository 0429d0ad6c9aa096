"""Per-process load: the DRM fdinfo engine-time parser on real captures, the reader's rules (one read per client,
counted once, counters that go back, capacity, a late read), host CPU/RSS from /proc, NVML's process samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from gpuwarden.ops.node.backends.fdinfo import parse
from gpuwarden.ops.foundation.deadline import Lanes
from gpuwarden.ops.foundation.model import GpuInfo, GpuProcess, snapshot_from_dict
from gpuwarden.ops.sampling.procload import ProcLoadReader
from helpers.simnode import wait_for

SIM_NODE = {"gpus": 2, "vram": "8GiB"}


# --- the parser, on fdinfo files people captured from real kernels ---------------------------------------------
@pytest.mark.parametrize("name, key, pdev, engine_ns, percent, vram", [
    # Linux 6.x, drm_print_memory_stats (the amd-gfx patch's example output)
    ("amdgpu_fdinfo_drm_print_memory_stats_format_2024.txt", "id:30", "0000:04:00.0", {"gfx": 39456116802}, {},
     544428 * 1024),
    # Linux 6.x per-IP engine keys (amdgpu_top issue 87)
    ("amdgpu_fdinfo_amdgpu_top87_drm_engine_gfx_client217.txt", "id:217", "0000:08:00.0", {"gfx": 107322799}, {},
     2068 * 1024),
    # Linux 5.15: no drm- keys, the kernel's own per-ring percent (amdgpu_top issue 17)
    ("amdgpu_fdinfo_old_format_kernel5.15.txt", "pasid:0000:04:00.0:32774", "0000:04:00.0", {}, {"gfx": 70.59},
     17196 * 1024),
])
def test_engine_time_from_real_captures(fixtures, name, key, pdev, engine_ns, percent, vram):
    c = parse((fixtures / "fdinfo" / name).read_text())
    assert (c.client_key, c.pdev, c.engine_ns, c.percent, c.vram_bytes) == (key, pdev, engine_ns, percent, vram)


def test_per_ring_keys_are_summed_into_their_engine_and_capacity_is_read():
    # Linux 5.19-6.3 printed one key per ring (drm-engine-gfx0, drm-engine-compute1); enc_1 is an engine of its own.
    c = parse("drm-driver:\tamdgpu\ndrm-client-id:\t4\ndrm-engine-compute0:\t10 ns\ndrm-engine-compute1:\t5 ns\n"
              "drm-engine-enc_1:\t7 ns\ndrm-engine-capacity-compute:\t2\ndrm-engine-capacity-dma:\t0\n")
    assert c.engine_ns == {"compute": 15, "enc_1": 7} and c.capacity == {"compute": 2}  # capacity 0 is refused


# --- the reader, in-process, over a tree of fdinfo files -----------------------------------------------------------
def _fdinfo(root, pid, fd, client, gfx_ns=None, compute_ns=None, pdev="0000:10:00.0", capacity=None):
    d = root / str(pid) / "fdinfo"
    d.mkdir(parents=True, exist_ok=True)
    lines = ["drm-driver:\tamdgpu", f"drm-pdev:\t{pdev}", f"drm-client-id:\t{client}", "drm-memory-vram:\t1024 KiB"]
    if gfx_ns is not None:
        lines.append(f"drm-engine-gfx:\t{gfx_ns} ns")
    if compute_ns is not None:
        lines.append(f"drm-engine-compute:\t{compute_ns} ns")
    if capacity:
        lines.append(f"drm-engine-capacity-compute:\t{capacity}")
    (d / str(fd)).write_text("\n".join(lines) + "\n")


def _proc(pid):
    return GpuProcess(pid=pid, start_time=1.0, user="u", command="x", state="sleeping", vram={0: 1 << 20})


GPUS = (GpuInfo(index=0, name="g", vendor="amd", bus_id="0000:10:00.0", device_files=("/dev/dri/renderD128",)),)


class Clock:
    """time.monotonic for the reader, moved by the test (the rates below are exact then)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def reader(tmp_path):
    clock = Clock()
    r = ProcLoadReader(fdinfo_root=tmp_path, deadline_s=0.5, lanes=Lanes(), clock=clock)
    r.clock = clock
    yield r
    r.close()


def test_a_client_seen_through_two_processes_is_read_once_and_counted_once(reader, tmp_path):
    me, child = os.getpid(), os.getppid()
    _fdinfo(tmp_path, me, 7, client=5, gfx_ns=0)
    _fdinfo(tmp_path, child, 7, client=5, gfx_ns=0)  # the same drm_file, as after fork
    fds = {(me, 10): {7: "/dev/dri/renderD128"}, (child, 20): {7: "/dev/dri/renderD128"}}
    procs = (_proc(me), _proc(child))
    first = reader.sample(procs, GPUS, fds)
    assert reader.reads == 2  # each descriptor is read once to learn which client it shows
    assert first[me].gpus[0].percent is None  # one reading: no interval yet
    reader.clock.now += 2.0
    _fdinfo(tmp_path, me, 7, client=5, gfx_ns=500_000_000, compute_ns=500_000_000)
    _fdinfo(tmp_path, child, 7, client=5, gfx_ns=500_000_000, compute_ns=500_000_000)
    load = reader.sample(procs, GPUS, fds)
    assert reader.reads == 1  # then one read per client
    # The oldest holder (start ticks 10) opened it: 1 s of busy time in 2 s, on it alone.
    assert load[me].gpus[0].percent == 50.0 and load[me].gpus[0].engines == {"gfx": 25.0, "compute": 25.0}
    assert load[me].gpus[0].shared_with == (child,) and load[child].gpus == {}


def test_counters_that_go_back_stay_at_their_larger_value_and_capacity_divides(reader, tmp_path):
    me = os.getpid()
    fds = {(me, 1): {3: "/dev/dri/renderD128"}}
    _fdinfo(tmp_path, me, 3, client=9, compute_ns=4_000_000_000, capacity=4)
    reader.sample((_proc(me),), GPUS, fds)
    reader.clock.now += 1.0
    _fdinfo(tmp_path, me, 3, client=9, compute_ns=3_000_000_000, capacity=4)  # drm-usage-stats: keep the larger
    assert reader.sample((_proc(me),), GPUS, fds)[me].gpus[0].percent == 0.0
    reader.clock.now += 1.0
    _fdinfo(tmp_path, me, 3, client=9, compute_ns=6_000_000_000, capacity=4)  # 2 s of 4 engines' 4 s
    assert reader.sample((_proc(me),), GPUS, fds)[me].gpus[0].engines == {"compute": 50.0}


def test_a_reused_fd_number_that_shows_another_client_is_followed(reader, tmp_path):
    me = os.getpid()
    fds = {(me, 1): {3: "/dev/dri/renderD128"}}
    _fdinfo(tmp_path, me, 3, client=1, gfx_ns=1)
    reader.sample((_proc(me),), GPUS, fds)
    _fdinfo(tmp_path, me, 3, client=2, gfx_ns=1)  # closed and opened again: a new drm_file behind fd 3
    reader.clock.now += 1.0
    load = reader.sample((_proc(me),), GPUS, fds)
    assert load[me].gpus[0].clients == 1 and load[me].gpus[0].percent is None  # a new client: no interval yet
    assert reader.reads == 1


def test_a_late_fdinfo_read_keeps_the_last_answer_and_says_so(reader, tmp_path):
    me = os.getpid()
    fds = {(me, 1): {3: "/dev/dri/renderD128"}}
    _fdinfo(tmp_path, me, 3, client=1, gfx_ns=0)
    reader.sample((_proc(me),), GPUS, fds)
    reader.clock.now += 1.0
    _fdinfo(tmp_path, me, 3, client=1, gfx_ns=250_000_000)
    good = reader.sample((_proc(me),), GPUS, fds)[me].gpus
    assert good[0].percent == 25.0
    # A descriptor not seen before whose fdinfo blocks (a FIFO: as amdgpu_show_fdinfo waits on a hung GPU's lock).
    fifo = tmp_path / str(me) / "fdinfo" / "4"
    os.mkfifo(fifo)
    fds = {(me, 1): {3: "/dev/dri/renderD128", 4: "/dev/dri/renderD128"}}  # the next deep scan's answer
    try:
        late = reader.sample((_proc(me),), GPUS, fds)
        assert reader.late is not None and reader.late.source == "fdinfo" and reader.late.path == str(fifo)
        assert late[me].gpus == good
    finally:
        threading.Thread(target=lambda: open(fifo, "w").close(), daemon=True).start()  # let the stuck read go


def test_host_cpu_rss_and_cpu_time_of_a_real_busy_process(reader):
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time
        p = GpuProcess(pid=spin.pid, start_time=1.0, user="u", command="spin", state="running")
        reader.clock.now = t0 = time.monotonic()  # real CPU time against real wall time
        first = reader.sample((p,), GPUS)[spin.pid]
        wait_for(lambda: time.monotonic() - t0 > 0.5, what="half a second")
        reader.clock.now = t1 = time.monotonic()
        load = reader.sample((p,), GPUS)[spin.pid]
        # The share of the interval it ran (a loaded 2-core box gives a spinner less than a core, never none).
        expected = 100 * (load.cpu_time_s - first.cpu_time_s) / (t1 - t0)
        assert load.cpu_percent is not None and load.cpu_percent > 5 and abs(load.cpu_percent - expected) < 5, load
        assert load.rss_bytes > 1 << 20 and load.threads == 1 and load.cpu_time_s >= 0
        assert load.source is None and load.gpus == {}  # no GPU source on this host
    finally:
        spin.kill()
        spin.wait()


# --- the simulated node: real processes, the real parser, the sampler -------------------------------------------
SHARED_TENANT = textwrap.dedent("""
    import os, sys, time
    from gpuwarden.ops.node.sim.node import SimNode
    node = SimNode(sys.argv[1])
    fd = os.open(str(node.render_node(0)), os.O_RDONLY)
    node.allocate(os.getpid(), 0, 1 << 30)
    client = node.open_client(os.getpid(), fd, 0, 0.5)
    if os.fork() == 0:  # the child keeps the descriptor: the same DRM client shows through both
        node.share_client(client, os.getpid(), fd)
        print(os.getpid(), flush=True)
        time.sleep(120)
        os._exit(0)
    time.sleep(120)
""")


def test_two_real_processes_holding_one_client_count_it_once(sim_settings, fixtures):
    from gpuwarden.ops.sampling.sampler import Sampler
    tenant = subprocess.Popen([sys.executable, "-c", SHARED_TENANT, str(sim_settings.state_dir)],
                              stdout=subprocess.PIPE, text=True)
    child = int(tenant.stdout.readline())
    sampler = Sampler(sim_settings)
    try:
        def measured():
            snap = sampler.snapshot(deep=True)
            load = snap.process_load.get(tenant.pid)
            return snap if load is not None and load.gpu_percent is not None else None
        snap = wait_for(measured, what="an interval of the tenant's engine time")
        assert sampler.load.reads == 1
        parent = snap.process_load[tenant.pid].gpus[0]
        assert 35 <= parent.percent <= 65, parent  # busy half the time, once: not 100 with the child's copy
        assert parent.shared_with == (child,) and parent.clients == 1 and parent.vram_bytes == 1 << 30
        assert snap.process_load[child].gpus == {}
        doc = json.loads(snap.to_json())
        mine = next(p for p in doc["processes"] if p["pid"] == tenant.pid)
        assert mine["load"]["gpus"]["0"]["percent"] == parent.percent and mine["load"]["source"] == "fdinfo"
        assert snapshot_from_dict(doc).process_load[tenant.pid] == snap.process_load[tenant.pid]
        # Inside the process records, which snapshot/1 leaves open: readers of the schema before it still validate.
        import jsonschema
        from gpuwarden.ops.foundation import jsondoc
        jsondoc.validate(doc)
        jsonschema.validate(doc, json.loads((fixtures / "schemas/snapshot.v1.before-deadlines.json").read_text()))
    finally:
        sampler.close()
        os.kill(child, 9)
        tenant.kill()
        tenant.wait()


def test_the_sim_drivers_engine_time_is_as_of_the_read_not_of_the_gpu_listing(sim_settings):
    """A kernel makes fdinfo at read time. The sim driver once wrote it when the GPUs were listed, so a read that
    came late (a loaded host) measured over a longer wall interval than the engine time had grown over: a
    tenant busy half the time read as 83% in CI. Here each listing is followed by a longer stall than the last."""
    import time as _time
    from gpuwarden.ops.sampling.sampler import Sampler
    tenant = subprocess.Popen([sys.executable, "-c", SHARED_TENANT, str(sim_settings.state_dir)],
                              stdout=subprocess.PIPE, text=True)
    child = int(tenant.stdout.readline())
    sampler = Sampler(sim_settings)
    listing = sampler.backend.gpus
    stalls = [0.0, 0.6]

    def late_after_listing():
        gpus = listing()
        _time.sleep(stalls.pop(0) if stalls else 0.0)
        return gpus
    sampler.backend.gpus = late_after_listing  # type: ignore[method-assign]
    try:
        def measured():
            snap = sampler.snapshot(deep=True)
            load = snap.process_load.get(tenant.pid)
            return load if load is not None and load.gpu_percent is not None else None
        load = wait_for(measured, what="an interval of the tenant's engine time")
        assert 35 <= load.gpus[0].percent <= 65, load  # measured over the stall as well: about 50, not 15
    finally:
        sampler.close()
        os.kill(child, 9)
        tenant.kill()
        tenant.wait()


# --- NVIDIA: nvmlDeviceGetProcessUtilization --------------------------------------------------------------------
def test_nvml_process_samples_become_gpu_percent_and_no_samples_read_as_idle(settings, fixtures):
    from gpuwarden.ops.node.backends.nvml import NvmlBackend
    from gpuwarden.ops.sampling.sampler import Sampler
    from standins import pynvml_standin as standin
    from standins.nvsmi_capture import parse_q
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        gpus = parse_q(fixtures / "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt")
        for proc, captured in zip(procs, gpus[0].processes):
            captured.pid = proc.pid
        busy, idle = procs[0].pid, procs[1].pid
        # two samples of one process in the window: the newer one counts
        samples = {0: [(busy, 10, 20, 5, 0, 0), (busy, 20, 87, 31, 0, 2)]}
        backend = NvmlBackend(settings, module=standin.build(gpus, utilisation=samples))
        sampler = Sampler(settings, backend, use_pidfds=False)
        load = sampler.snapshot(deep=False).process_load
        assert load[busy].gpus[0].percent == 87.0 and load[busy].gpus[0].engines["mem"] == 31.0
        assert load[idle].gpus[0].percent == 0.0 and load[busy].source == "nvml"
        # nothing newer than the last timestamp: NVML_ERROR_NOT_FOUND, every process idle (not unknown)
        load = sampler.snapshot(deep=False).process_load
        assert load[busy].gpus[0].percent == 0.0
        sampler.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_nvml_without_process_utilisation_leaves_gpu_percent_unknown(settings, fixtures):
    from gpuwarden.ops.node.backends.nvml import NvmlBackend
    from standins import pynvml_standin as standin
    from standins.nvsmi_capture import parse_q
    backend = NvmlBackend(settings, module=standin.build(parse_q(fixtures / "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt")))
    assert backend.process_utilisation() is None
    backend.close()


def test_past_its_budget_the_reader_reads_in_turns(tmp_path):
    """A node of more DRM clients than per_refresh reads that many a refresh, each in turn, never more."""
    clock = Clock()
    reader = ProcLoadReader(fdinfo_root=tmp_path, deadline_s=0.5, lanes=Lanes(), clock=clock, per_refresh=2)
    pids = [os.getpid(), os.getppid(), 1]
    fds = {(pid, i): {3: "/dev/dri/renderD128"} for i, pid in enumerate(pids)}
    for n, pid in enumerate(pids):
        _fdinfo(tmp_path, pid, 3, client=n + 1, gfx_ns=0)
    procs = tuple(_proc(pid) for pid in pids)
    try:
        reader.sample(procs, GPUS, fds)
        assert reader.reads == 3  # every descriptor once, to learn its client
        for step in range(1, 4):
            clock.now += 1.0
            for n, pid in enumerate(pids):
                _fdinfo(tmp_path, pid, 3, client=n + 1, gfx_ns=int(step * 5e8))  # 50% busy, all of them
            load = reader.sample(procs, GPUS, fds)
            assert reader.reads == 2
        # Within two turns each client was read again: each shows its share over its own interval.
        assert all(load[pid].gpus[0].percent == 50.0 for pid in pids), load
    finally:
        reader.close()


def test_status_shows_a_busy_sim_tenants_load(sim_cli, state_dir):
    """`sim hold --busy` makes a DRM client whose engine time grows; status --json carries the tenant's load in its
    process record (GPU% needs two samples: null from a one-shot status), and the text has its GPU% column."""
    from helpers.simnode import cli_argv
    tenant = subprocess.Popen(cli_argv(state_dir, "sim", "hold", "--gpu", "1", "--size", "1GiB",
                                       "--busy", "40"), stdout=subprocess.PIPE, text=True)
    try:
        assert tenant.stdout.readline().startswith("holding")
        doc = json.loads(sim_cli("status", "--json").stdout)
        mine = next(p for p in doc["processes"] if p["pid"] == tenant.pid)
        load = mine["load"]
        assert load["source"] == "fdinfo" and load["rss_bytes"] > 0 and load["threads"] >= 1
        assert load["gpus"]["1"]["clients"] == 1 and load["gpus"]["1"]["engine_ns"]["gfx"] > 0
        assert load["gpus"]["1"]["percent"] is None  # one sample: no interval
        text = sim_cli("status", env={**os.environ, "COLUMNS": "120"}).stdout
        header = next(line for line in text.splitlines() if line.lstrip().startswith("PID"))
        assert "GPU%" in header
    finally:
        tenant.terminate()
        tenant.wait()


def test_nvml_asks_for_process_utilisation_only_where_processes_run(settings, fixtures):
    # The idle H200's profile: nvmlDeviceGetProcessUtilization on a GPU with no process was 61% of the
    # console's CPU. A GPU whose process list is empty is not asked (nobody to give its time to).
    from gpuwarden.ops.node.backends.nvml import NvmlBackend
    from standins import pynvml_standin as standin
    from standins.nvsmi_capture import parse_q
    gpus = parse_q(fixtures / "nvidia/nvidia_smi_q_text_8x_h100_sxm_565.txt")  # eight idle GPUs
    gpus[3].processes = parse_q(fixtures / "nvidia/nvidia_smi_q_text_h100_80gb_hbm3_590.48.01_load.txt")[0].processes
    mod = standin.build(gpus, utilisation={})
    backend = NvmlBackend(settings, module=mod)
    try:
        busy = {u.gpu_index for u in backend.process_usage()}
        answer = backend.process_utilisation()
    finally:
        backend.close()
    assert busy == {3}
    assert mod.calls.count("nvmlDeviceGetProcessUtilization") == len(busy)
    assert answer is not None and set(answer) == set(range(len(gpus)))
    assert all(answer[i] == {} for i in set(range(len(gpus))) - busy)
