"""The metrics exposition: families from snapshots (values, labels, no stale series), promtool's lint, the
per-process cap, `gpuwarden metrics` and its textfile on the sim node, and the HTTP(S) listener.
"""

from __future__ import annotations

import gzip
import os
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.simnode import start_tenant

from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.metrics.collector import SnapshotCollector, registry_for, render
from gpuwarden.ops.metrics.reading import MetricsOptions
from gpuwarden.ops.foundation.model import GpuProcess
from helpers.metrics_exposition import GiB, NOW, make_reading, make_snapshot

def _samples(text: bytes) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}}."""
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _one(samples, name: str, **labels) -> float:
    hits = [v for k, v in samples.get(name, {}).items() if labels.items() <= dict(k).items()]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples in {samples.get(name)}"
    return hits[0]


def test_families_carry_the_snapshot_in_base_units():
    s = _samples(render(make_reading(make_snapshot())))
    gpu1 = dict(gpu="1", bus_id="0000:11:00.0", uuid="u1", model="AMD Instinct MI300X")
    assert _one(s, "gpuwarden_gpu_vram_used_bytes", **gpu1) == 21 * GiB
    assert _one(s, "gpuwarden_gpu_residual_bytes", **gpu1) == 4 * GiB
    assert _one(s, "gpuwarden_gpu_busy_ratio", gpu="1") == 0.5
    # Holders by kind, every kind present: a disk-sleep process with no VRAM holds only a device file.
    assert {k: _one(s, "gpuwarden_gpu_residual_holders", gpu="1", kind=k)
            for k in ("zombie", "dead-pid", "device-file", "disk-sleep", "unknown-pid")} == \
        {"zombie": 1, "dead-pid": 1, "device-file": 1, "disk-sleep": 0, "unknown-pid": 0}
    assert _one(s, "gpuwarden_gpu_residual_age_seconds", gpu="1") == 90
    assert _one(s, "gpuwarden_gpu_residual_age_seconds", gpu="0") == 0
    # GPU 2: significant residual with no holder -> only a reset clears it.
    assert [_one(s, "gpuwarden_gpu_needs_reset", gpu=g) for g in "012"] == [0, 0, 1]
    assert _one(s, "gpuwarden_gpu_baseline_bytes", gpu="2") == GiB and _one(s, "gpuwarden_gpu_drained", gpu="2") == 1
    # Engines: a state set, counters, crash signals pre-created at 0.
    assert _one(s, "gpuwarden_engine_phase", engine="dp1", phase="crashed") == 1
    assert _one(s, "gpuwarden_engine_phase", engine="dp1", phase="serving") == 0
    assert [_one(s, "gpuwarden_engine_up", engine=e) for e in ("dp0", "dp1")] == [1, 0]
    assert _one(s, "gpuwarden_engine_restarts_total", engine="dp0") == 2
    assert _one(s, "gpuwarden_engine_crashes_total", engine="dp0", signal="SIGSEGV") == 2
    assert _one(s, "gpuwarden_engine_crashes_total", engine="dp0", signal="SIGBUS") == 0
    assert _one(s, "gpuwarden_engine_crashes_total", engine="dp1", signal="SIGUSR2") == 1
    assert _one(s, "gpuwarden_engine_phase_seconds", engine="dp0") == 30
    # Arena and the plan's budget.
    assert _one(s, "gpuwarden_arena_mappers", arena="/dev/shm/w") == 2
    assert _one(s, "gpuwarden_arena_registered", arena="/dev/shm/w") == 1
    assert _one(s, "gpuwarden_arena_plan_fits", arena="/dev/shm/w") == 0
    assert _one(s, "gpuwarden_kfd_system_limit_bytes") == 500 * GiB
    assert _one(s, "gpuwarden_kernel_findings_total", category="gpu-page-fault", severity="error") == 3
    assert _one(s, "gpuwarden_agent_info", backend="amdsmi", simulated="false", mode="agent") == 1
    assert _one(s, "gpuwarden_agent_stale") == 0
    # Off by default: no per-process series, no hostname label.
    assert "gpuwarden_process_vram_bytes" not in s
    assert not any("hostname" in dict(k) for series in s.values() for k in series)


def test_a_gpu_engine_or_process_that_went_away_leaves_no_series():
    tenant = GpuProcess(pid=7, start_time=1.0, user="ann", command="/usr/bin/python3 serve.py --token=x",
                        state="sleeping", vram={0: 5 * GiB})
    readings = iter([make_reading(make_snapshot(processes=(tenant,))), make_reading(make_snapshot(gpus=(0,), engines=False))])
    registry = registry_for(SnapshotCollector(lambda: next(readings), MetricsOptions(per_process=True)))
    from prometheus_client.exposition import generate_latest
    first, second = _samples(generate_latest(registry)), _samples(generate_latest(registry))
    assert _one(first, "gpuwarden_process_vram_bytes", pid="7", command="python3", user="ann") == 5 * GiB
    assert "gpuwarden_process_gpu_busy_percent" not in first  # no load in this snapshot: no GPU% series
    assert _one(first, "gpuwarden_gpu_vram_used_bytes", gpu="2") == 22 * GiB
    assert {dict(k)["gpu"] for k in second["gpuwarden_gpu_vram_used_bytes"]} == {"0"}
    assert not any(n.startswith("gpuwarden_engine_") for n in second)
    assert "gpuwarden_process_vram_bytes" not in second


def test_per_process_series_are_capped_and_the_rest_summed():
    procs = [GpuProcess(pid=1000 + i, start_time=1.0, user="u", command="t", state="sleeping",
                        vram={i % 2: (i + 1) << 20}) for i in range(300)]
    options = MetricsOptions(per_process=True, per_process_max=256, hostname="n1")
    s = _samples(render(make_reading(make_snapshot(processes=procs)), options))
    series = s["gpuwarden_process_vram_bytes"]
    assert len(series) == 256
    assert min(series.values()) == 45 << 20  # the 44 smallest (1..44 MiB) are left out, their sum kept
    assert sum(s["gpuwarden_process_vram_unlisted_bytes"].values()) == sum(range(1, 45)) << 20
    assert all(dict(k)["hostname"] == "n1" for k in series)


def test_one_shot_reading_leaves_out_what_only_the_agent_knows():
    s = _samples(render(make_reading(make_snapshot(), mode="oneshot", age_s=None, residual_since=None, findings=None,
                                 plan=None)))
    for name in ("gpuwarden_gpu_residual_age_seconds", "gpuwarden_kernel_findings_total",
                 "gpuwarden_agent_snapshot_age_seconds", "gpuwarden_kfd_system_limit_bytes"):
        assert name not in s
    assert _one(s, "gpuwarden_agent_info", mode="oneshot") == 1


def test_promtool_accepts_the_exposition(tmp_path):
    procs = [GpuProcess(pid=7, start_time=1.0, user="ann", command="python3", state="sleeping", vram={0: GiB})]
    body = render(make_reading(make_snapshot(processes=procs)), MetricsOptions(per_process=True, hostname="n1"))
    proc = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # promtool's lint can fail: a counter without _total is refused.
    bad = body.replace(b"gpuwarden_engine_restarts_total", b"gpuwarden_engine_restarts")
    proc = subprocess.run(["promtool", "check", "metrics"], input=bad, capture_output=True, timeout=60)
    assert proc.returncode != 0 and b"_total" in proc.stdout + proc.stderr


def test_metrics_command_on_the_sim_node_and_its_textfile(cli, state_dir, tmp_path):
    assert cli("--backend", "sim", "sim", "init", "--gpus", "2", "--vram", "24GiB").returncode == 0
    tenant = start_tenant(state_dir, 1, "3GiB")
    try:
        proc = cli("--backend", "sim", "metrics", "--per-process")
        assert proc.returncode == 0, proc.stderr
        s = _samples(proc.stdout.encode())
        assert _one(s, "gpuwarden_process_vram_bytes", gpu="1", pid=str(tenant.pid)) == 3 * GiB
        assert _one(s, "gpuwarden_gpu_vram_accounted_bytes", gpu="1") == 3 * GiB
        assert _one(s, "gpuwarden_agent_info", simulated="true", mode="oneshot", backend="sim") == 1
        lint = subprocess.run(["promtool", "check", "metrics"], input=proc.stdout, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr

        textdir = tmp_path / "textfile"
        textdir.mkdir()
        proc = cli("--backend", "sim", "metrics", "--textfile", str(textdir), "--hostname-label")
        assert proc.returncode == 0, proc.stderr
        assert os.listdir(textdir) == ["gpuwarden.prom"]  # the temporary file was renamed, none left
        path = textdir / "gpuwarden.prom"
        assert oct(os.stat(path).st_mode & 0o777) == "0o644"
        s = _samples(path.read_bytes())
        assert _one(s, "gpuwarden_gpu_vram_used_bytes", gpu="1", hostname=os.uname().nodename) == 3 * GiB
        assert "gpuwarden_process_vram_bytes" not in s
    finally:
        tenant.terminate()
        tenant.wait(10)
    proc = cli("--backend", "sim", "metrics", "--textfile", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stderr.count("\n") <= 2 and "is not a directory" in proc.stderr


# --- the listener --------------------------------------------------------------------------------------------------
@pytest.fixture
def listener():
    from prometheus_client import make_wsgi_app

    from gpuwarden.ops.services.metrics_server import Listener
    started = []

    def start(tls=None, listen="127.0.0.1:0"):
        reading = make_reading(make_snapshot())
        app = make_wsgi_app(registry_for(SnapshotCollector(lambda: reading)))
        lst = Listener(listen, app, tls)
        lst.start()
        started.append(lst)
        return lst
    yield start
    for lst in started:
        lst.stop()


def _port(lst) -> int:
    return lst.server.server_address[1]


def test_listener_serves_plain_and_gzip(listener):
    lst = listener()
    with urllib.request.urlopen(f"http://127.0.0.1:{_port(lst)}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        plain = r.read()
    assert b"gpuwarden_gpu_residual_bytes" in plain
    req = urllib.request.Request(f"http://127.0.0.1:{_port(lst)}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(r.read()) == plain


def test_listener_tls_with_client_certificates_and_a_stalled_handshake(listener, tmp_path):
    from gpuwarden.ops.services.metrics_server import TlsFiles

    def make(name: str, *extra: str) -> None:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        f"/CN={name}", "-keyout", str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.pem"),
                        *extra], check=True, capture_output=True, timeout=60)
    make("server", "-addext", "subjectAltName=IP:127.0.0.1")
    make("client")
    lst = listener(TlsFiles(tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "client.pem"))
    assert lst.url.startswith("https://127.0.0.1:")
    # A client that connects and never says a word does not hold up the next scrape.
    idle = socket.create_connection(("127.0.0.1", _port(lst)))
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "server.pem"))
        ctx.load_cert_chain(str(tmp_path / "client.pem"), str(tmp_path / "client.key"))
        t0 = time.monotonic()
        with urllib.request.urlopen(f"https://127.0.0.1:{_port(lst)}/metrics", context=ctx, timeout=10) as r:
            assert b"gpuwarden_agent_info" in r.read()
        assert time.monotonic() - t0 < 5
        # Without a client certificate the handshake is refused.
        bare = ssl.create_default_context(cafile=str(tmp_path / "server.pem"))
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
            urllib.request.urlopen(f"https://127.0.0.1:{_port(lst)}/metrics", context=bare, timeout=10).read()
    finally:
        idle.close()


def test_listener_errors_name_the_address(listener, tmp_path):
    from gpuwarden.ops.services.metrics_server import Listener, TlsFiles, parse_listen
    lst = listener()
    with pytest.raises(GpuwardenError, match="cannot listen for metrics on 127.0.0.1:"):
        Listener(f"127.0.0.1:{_port(lst)}", lst.app).start()
    with pytest.raises(GpuwardenError, match="is not HOST:PORT"):
        parse_listen("localhost")
    assert parse_listen(":9835") == ("0.0.0.0", 9835) and parse_listen("[::1]:9835") == ("::1", 9835)
    with pytest.raises(GpuwardenError, match="cannot load the metrics TLS certificate"):
        Listener("127.0.0.1:0", lst.app, TlsFiles(tmp_path / "no.pem", tmp_path / "no.key")).start()


def test_registration_figures_of_the_last_run():
    from gpuwarden.ops.foundation import model
    if not hasattr(model, "Registration"):
        pytest.skip("engine registration records arrive with the preload interposer (issue 14)")
    R = model.Registration
    regs = (R("register", "hipHostRegister", 8 * GiB, "registered", NOW - 100, 9.0, 1.0, 0, 99),  # an older run
            R("register", "hipHostRegister", 8 * GiB, "registered", NOW - 20, 2.5, 4.0, 0, 100),
            R("register", "hipHostRegister", GiB, "failed", NOW - 10, 0.5, 0.0, 1, 100))
    snap = make_snapshot()
    snap = replace(snap, engines=(replace(snap.engines[0], registrations=regs),))
    s = _samples(render(make_reading(snap)))
    assert _one(s, "gpuwarden_engine_registration_seconds", engine="dp0") == 3.0
    assert _one(s, "gpuwarden_engine_registration_wait_seconds", engine="dp0") == 4.0
    assert _one(s, "gpuwarden_engine_registered_bytes", engine="dp0") == 8 * GiB
    assert _one(s, "gpuwarden_engine_registrations", engine="dp0", outcome="failed") == 1


def test_per_process_gpu_busy_follows_the_vram_pairs_and_their_cap():
    import dataclasses
    from gpuwarden.ops.foundation.model import GpuLoad, ProcessLoad
    procs = [GpuProcess(pid=1000 + i, start_time=1.0, user="u", command="t", state="sleeping",
                        vram={0: (i + 1) << 20}) for i in range(300)]
    loads = {p.pid: ProcessLoad(pid=p.pid, gpus={0: GpuLoad(percent=float(i % 100))}, source="fdinfo")
             for i, p in enumerate(procs)}
    snap = dataclasses.replace(make_snapshot(processes=procs), process_load=loads)
    s = _samples(render(make_reading(snap), MetricsOptions(per_process=True, per_process_max=256)))
    busy = s["gpuwarden_process_gpu_busy_percent"]
    assert len(busy) == 256 and set(busy) == set(s["gpuwarden_process_vram_bytes"])  # the same pairs, the same cap
    assert _one(s, "gpuwarden_process_gpu_busy_percent", pid="1299", gpu="0") == 99.0
    assert "gpuwarden_process_gpu_busy_percent" not in _samples(render(make_reading(snap), MetricsOptions()))
