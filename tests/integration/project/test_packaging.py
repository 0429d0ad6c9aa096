"""gpuwarden as a user gets it: the manylinux wheels, and the OCI image, on a Debian with no C compiler.

The wheels are built by deploy/wheel/build.py (zig against glibc 2.17) and the image's root fs by
deploy/container/build.py (mmdebstrap, cached between sessions under ~/.cache/gpuwarden-build); each is
built once a session. Inside the root fs (unshare + chroot) the installed wheel runs its CLI and its
interposer, which is preloaded into an unmodified stand-in engine; doctor and the Kubernetes agent read a host
tree mounted the way the AMD overlay's DaemonSet mounts the host, the agent talking to the API-server stand-in.
The wheel also goes into fresh venvs beside PyPI's ops, tui and playbooks (both orders), and a source build
without a compiler installs all but the interposer.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.cli import wheel_build_module
from engines.preload_harness import SIZE, events, phases

import gpuwarden.ops

wheelbuild = wheel_build_module()  # deploy/wheel/build.py; the container's build imports it too

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first build of the root fs downloads it
VERSION = gpuwarden.ops.__version__
ELF_MACHINE = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}


def _need(*tools: str) -> None:
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        pytest.skip(f"needs {', '.join(absent)} (tests/run-all.sh installs them)")


@pytest.fixture(scope="session")
def wheels(manylinux_wheel) -> dict[str, Path]:
    built = {arch: manylinux_wheel(arch) for arch in wheelbuild.ARCHES}
    if None in built.values():
        pytest.skip("the wheels are cross-built with PyPI's ziglang (test extra)")
    return built


TRIAGE_EXT = "gpuwarden/ops/triage/_lines.abi3.so"  # triage's compiled line parser (native/triage/lines.c)


def _library(wheel: Path, into: Path, name: str = "gpuwarden/ops/engines/libgwpreload.so") -> Path:
    with zipfile.ZipFile(wheel) as z:
        z.extract(name, into)
    return into / name


def glibc_versions(lib: Path) -> set[tuple[int, ...]]:
    """Every GLIBC_x.y a library asks of glibc (its .gnu.version_r), as tuples."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection
    out = set()
    with lib.open("rb") as f:
        elf = ELFFile(f)
        for section in elf.iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for _, auxes in section.iter_versions():
                    for aux in auxes:
                        m = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", aux.name)
                        if m:
                            out.add(tuple(int(x) for x in m[1].split(".")))
    return out


@pytest.mark.parametrize("arch", wheelbuild.ARCHES)
def test_wheel_is_manylinux2014_and_asks_nothing_newer_than_glibc_2_17(wheels, arch, tmp_path):
    wheel = wheels[arch]
    assert wheel.name == f"gpuwarden-{VERSION}-py3-none-manylinux2014_{arch}.whl"
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"gpuwarden-{VERSION}.dist-info/WHEEL").decode()
        names = z.namelist()
    assert f"Tag: py3-none-manylinux2014_{arch}" in meta.splitlines() and "Root-Is-Purelib: false" in meta
    # one namespace only: nothing installs as a bare ops/tui/playbooks
    assert {n.split("/")[0] for n in names} == {"gpuwarden", f"gpuwarden-{VERSION}.dist-info"}
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    for lib in (_library(wheel, tmp_path), _library(wheel, tmp_path, TRIAGE_EXT)):
        with lib.open("rb") as f:
            elf = ELFFile(f)
            assert elf["e_machine"] == ELF_MACHINE[arch] and elf["e_type"] == "ET_DYN", lib
            assert elf.get_section_by_name(".debug_info") is None, lib  # shipped stripped
            needed = {t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                      for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"}
            assert not any(n.startswith("libpython") for n in needed), (lib, needed)  # any CPython's, abi3
        versions = glibc_versions(lib)
        assert versions and max(versions) <= (2, 17), (lib, sorted(versions))


@pytest.fixture(scope="session")
def image_build(wheels, tmp_path_factory) -> tuple[Path, Path | None]:
    """The image built once a session: its root fs, and the OCI layout + archive packed from it (umoci) before
    any test enters it (what the tests run inside leaves files behind; the image must not carry them)."""
    _need("mmdebstrap", "unshare", "chroot")
    image = _container()
    base = tmp_path_factory.mktemp("image")
    root = image.rootfs(wheels["x86_64"], base / "root", image.default_cache(), image.default_pip_cache())
    if shutil.which("umoci") is None:
        return root, None
    image.oci(root, base, VERSION)
    return root, base


@pytest.fixture(scope="session")
def image_root(image_build) -> Path:
    return image_build[0]


@functools.cache
def _container():
    """deploy/container/build.py (its module name clashes with deploy/wheel's, so it is loaded by path)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpuwarden_container_build", REPO / "deploy/container/build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sh(root: Path, script: str, **kw):
    return _container().chroot(root, script, capture=True, check=False, **kw)


def test_the_image_has_no_compiler_and_runs_the_cli(image_root):
    proc = sh(image_root, "for t in gcc cc clang tcc; do command -v $t && exit 3; done; gpuwarden --version")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(VERSION), proc.stdout
    # the wheel's prebuilt triage line parser loads into the image's Python (Debian's, another build than ours)
    proc = sh(image_root, f"{_container().VENV}/bin/python -c 'from gpuwarden.ops.triage import lineparse; "
                          "print(lineparse.COMPILED)'")
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stdout + proc.stderr
    proc = sh(image_root, "gpuwarden --state-dir /tmp/s --backend sim status --json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["gpus"], doc
    proc = sh(image_root, "gpuwarden --state-dir /tmp/s --backend sim doctor --json")
    assert proc.returncode in (0, 1), proc.stderr
    assert {c["id"] for c in json.loads(proc.stdout)["checks"]} >= {"arena-fs", "memlock"}
    proc = sh(image_root, "gpuwarden arena create /tmp/a.arena --size 1MiB && gpuwarden arena verify /tmp/a.arena")
    assert proc.returncode == 0 and "/tmp/a.arena" in proc.stdout, proc.stdout + proc.stderr  # create + verify


def test_the_installed_interposer_gates_an_unmodified_engine(image_root, standins, tmp_path):
    # the stand-ins are bound in at their own path ($ORIGIN rpaths); bookworm's glibc is this host's
    script = f"""
L=$(/opt/gpuwarden/bin/python -c 'from gpuwarden.ops.engines import preload; print(preload.LIBRARY)')
W=/tmp/work; mkdir -p $W/standin
STANDIN_DIR=$W/standin STANDIN_REGISTER_MS=20 LD_PRELOAD=$L GPUWARDEN_STATUS_FILE=$W/status.jsonl \\
GPUWARDEN_ENGINE=test GPUWARDEN_GATE_DIR=$W/gate GPUWARDEN_GATE_SLOTS=1 \\
    {standins}/engine_dlopen {SIZE} dlopen > $W/out 2>&1 &
pid=$!
for i in $(seq 600); do grep -q serving $W/out && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
kill -TERM $pid; wait $pid; echo "exit $?"; cat $W/out
"""
    proc = sh(image_root, script, binds={str(standins): str(standins), str(tmp_path): "/tmp/work"})
    assert "exit 0" in proc.stdout and "register returned 0" in proc.stdout, proc.stdout + proc.stderr
    assert phases(tmp_path) == ["registering", "registered", "unregistering", "unregistered"]
    registered = next(e for e in events(tmp_path) if e.phase == "registered")
    assert registered.data["via"] == "dlsym" and registered.data["bytes"] == SIZE


@pytest.fixture(scope="session")
def oci_image(image_build) -> Path:
    """The folder with the session image's OCI layout (oci/) and archive."""
    _need("umoci")
    return image_build[1]


def test_the_oci_image_is_tagged_with_the_version(oci_image):
    archive = oci_image / f"gpuwarden-{VERSION}.oci.tar"
    assert archive.stat().st_size > 0
    size = _container().image_size(oci_image / "oci", VERSION)
    assert 10e6 < size < 200e6, size  # RESULTS.md states it; no compiler, no test deps


def _image_config(layout: Path, tag: str) -> dict:
    index = json.loads((layout / "index.json").read_text())
    desc = next(m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    blob = lambda d: json.loads((layout / "blobs" / d["digest"].replace(":", "/")).read_text())  # noqa: E731
    return blob(blob(desc)["config"])


# --- the image on a node, mounted as the DaemonSet mounts the host -------------------------------------------
NODE = "gpu-node-7"
LEAK_GPU, LEAK = 2, 14 << 30


def _host_tree(where: Path) -> Path:
    """A 4x MI300X node's /sys and /proc: a healthy node in the kernel's formats (tests/helpers/doctor_tree.py) with the
    cards' ids, VBIOS and firmware and the driver version of a captured `rocm-smi -a`, and GPU 2 holding 14 GiB
    that no process owns (an ownerless leak)."""
    from helpers.doctor_tree import from_rocm_smi, healthy_node
    from helpers.sysfs_tree import write
    healthy_node(where, gpus=4)
    from_rocm_smi(where / "sys", REPO / "tests/fixtures/rocm-smi/rocm_smi_showallinfo_a_4x_mi300x.txt")
    write(where / f"sys/class/drm/card{LEAK_GPU}/device/mem_info_vram_used", f"{LEAK}\n")
    return where


def _daemonset_mounts(pod: dict, host: Path, scratch: Path, config: dict[str, str]) -> tuple[dict, tuple, dict]:
    """binds, read-only paths and environment for the chroot, from the rendered DaemonSet: each hostPath volume
    becomes this test's stand-in for that host path, the ConfigMap a folder of its keys, an emptyDir a folder."""
    (c,) = pod["containers"]
    vols = {v["name"]: v for v in pod["volumes"]}
    stand_in = {"/proc": host / "proc", "/sys": host / "sys", "/run/gpuwarden": scratch / "state",
                "/var/lib/kubelet/pod-resources": scratch / "kubelet",
                "/var/lib/amd-metrics-exporter": scratch / "amd"}
    binds, readonly = {}, []
    for m in c["volumeMounts"]:
        vol = vols[m["name"]]
        if "hostPath" in vol and vol["hostPath"]["path"].startswith("/dev"):
            continue  # the chroot has the host's /dev already (no GPU here: nothing to see in it)
        if "hostPath" in vol:
            src = stand_in[vol["hostPath"]["path"]]  # a KeyError: a new host path this test must stand in for
        elif "configMap" in vol:
            src = scratch / "config"
            for key, text in config.items():
                (src / key).parent.mkdir(parents=True, exist_ok=True)
                (src / key).write_text(text)
        else:
            assert "emptyDir" in vol, vol
            src = scratch / m["name"]
        src.mkdir(parents=True, exist_ok=True)
        binds[str(src)] = m["mountPath"]
        if m.get("readOnly"):
            readonly.append(m["mountPath"])
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env["NODE_NAME"] = NODE  # the downward API's spec.nodeName
    return binds, tuple(readonly), env


@pytest.fixture(scope="module")
def image_agent(image_root, tmp_path_factory):
    """The image's `gpuwarden agent --kubernetes` as the AMD overlay's DaemonSet runs it (its command, env,
    mounts and node.toml), the host tree under /host, talking to the API-server stand-in (the ClusterRole's
    verbs only) and the kubelet's pod-resources stand-in."""
    import signal
    import subprocess

    from helpers.net import free_port
    from helpers.k8s import cluster_role_rules
    from helpers.kustomize_render import by_kind, render
    from standins.kube_apiserver import FakeApiServer
    from standins.podresources_server import PodResourcesServer
    docs = render("overlays/amd")
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    scratch = tmp_path_factory.mktemp("node")
    host = _host_tree(scratch / "host")
    api = FakeApiServer().start()
    api.allowed = cluster_role_rules()
    api.add_node(NODE)
    config = dict(by_kind(docs, "ConfigMap")["data"])
    config["kubeconfig"] = api.write_kubeconfig(scratch / "kubeconfig").read_text()  # in-cluster credentials here
    binds, readonly, env = _daemonset_mounts(pod, host, scratch, config)
    env["KUBECONFIG"] = str(Path(env["GPUWARDEN_CONFIG"]).parent / "kubeconfig")
    (scratch / "kubelet").mkdir(exist_ok=True)
    pr = PodResourcesServer(str(scratch / "kubelet/kubelet.sock")).start()
    (c,) = pod["containers"]
    argv = list(c["command"])
    # the shipped 0.0.0.0:9835 would collide with whatever else this machine runs: a free loopback port
    argv[argv.index("--metrics-listen") + 1] = f"127.0.0.1:{free_port()}"
    log = scratch / "tmp/agent.log"  # the pod's emptyDir /tmp
    cmd, outer_env = _container().chroot_argv(image_root, "exec " + " ".join(argv) + " >/tmp/agent.log 2>&1",
                                              binds=binds, readonly=readonly, env=env)
    proc = subprocess.Popen(cmd, env=outer_env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        yield {"api": api, "state": scratch / "state", "binds": binds, "readonly": readonly, "env": env,
               "log": log, "proc": proc}
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)  # unshare and the namespace's processes (--kill-child)
                proc.wait(15)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        pr.stop()
        api.stop()


def _log(agent) -> str:
    try:
        return agent["log"].read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"


def test_the_images_kubernetes_agent_reads_the_mounted_host_and_sets_the_node_condition(image_agent):
    from helpers.simnode import wait_for

    from gpuwarden.ops.k8s.nodesignal import CONDITION
    api = image_agent["api"]
    def residual():
        assert image_agent["proc"].poll() is None, f"the image's agent exited:\n{_log(image_agent)}"
        c = api.condition(NODE, CONDITION)
        return c if c and c["status"] == "True" else None
    cond = wait_for(residual, timeout=90, what=f"the image's agent to set {CONDITION}=True")
    assert cond["reason"] == "ResidualVRAM" and f"GPU {LEAK_GPU}" in cond["message"], cond
    assert "14.0 GiB" in cond["message"], cond
    assert not [r for r in api.calls() if r.status == 403], "the agent used a verb the ClusterRole does not grant"
    # the taint waits for taint_after (the shipped 2m): not yet
    assert not api.taints(NODE), api.taints(NODE)


def test_the_images_doctor_reads_the_mounted_host(image_root, image_agent):
    proc = sh(image_root, "gpuwarden doctor --json", binds=image_agent["binds"], readonly=image_agent["readonly"],
              env=image_agent["env"])
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    checks = {c["id"]: c for c in doc["checks"]}
    # the captured rocm-smi's driver and firmware, the tree's four GPUs, read from /host by the sysfs backend
    assert checks["gpu-driver"]["verdict"] == "pass" and "amdgpu 6.7.0" in checks["gpu-driver"]["reason"]
    assert "4 AMD GPU(s)" in checks["gpu-driver"]["reason"], checks["gpu-driver"]
    assert checks["firmware"]["verdict"] == "pass" and "4 GPU(s)" in checks["firmware"]["reason"]
    assert checks["gpu-answers"]["verdict"] == "pass" and "(sysfs)" in checks["gpu-answers"]["reason"]
    # the DaemonSet's agent beside it, found on the shared /run/gpuwarden
    assert checks["agent"]["verdict"] != "skip", checks["agent"]
    assert "Traceback" not in proc.stderr


def test_one_version_everywhere(wheels, image_root, oci_image, image_agent):
    """gpuwarden --version, the wheel's name and metadata, the image's tag (every rendered manifest and the
    image's own config) and the agent's /healthz: all ops/__init__.py's __version__."""
    from gpuwarden.ops.agent.client import get
    from helpers.kustomize_render import AGENT_VARIANTS, SHIPPED, containers, render
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION
    assert wheelbuild.version() == VERSION  # what the wheel and image builds read
    found: dict[str, set[str]] = {}
    cli = sh(image_root, "gpuwarden --version")
    found["--version in the image"] = {cli.stdout.split()[-1]}
    for arch, wheel in wheels.items():
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(f"gpuwarden-{VERSION}.dist-info/METADATA").decode()
        found[f"{arch} wheel name"] = {wheel.name.split("-")[1]}
        found[f"{arch} wheel metadata"] = set(re.findall(r"^Version: (.+)$", meta, re.M))
    found["manifests' image tags"] = {c["image"].split(":", 1)[1] for v in (*SHIPPED, *AGENT_VARIANTS)
                                      for d in render(v) for c in containers(d) if c["image"].startswith("gpuwarden:")}
    index = json.loads((oci_image / "oci/index.json").read_text())
    found["image tags"] = {m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]}
    found["image label"] = {_image_config(oci_image / "oci", VERSION)["config"]["Labels"][
        "org.opencontainers.image.version"]}
    from helpers.simnode import wait_for
    reply = wait_for(lambda: get(image_agent["state"] / "agent.sock", "/healthz", timeout=5), timeout=90,
                     what="the image's agent's /healthz")
    found["agent /healthz"] = {reply.json()["version"]}
    assert all(v == {VERSION} for v in found.values()), found


def test_a_source_install_without_a_compiler_has_all_but_the_interposer_and_says_so(tmp_path):
    # the sdist's build with no C compiler to be found: setup.py must warn, not fail. Built as pip builds a
    # user's source install, in an isolated env from [build-system] requires (the one such build in the suite:
    # it proves those requirements are enough)
    import subprocess
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    env.pop("GPUWARDEN_PRELOAD_PREBUILT", None)
    env.pop("GPUWARDEN_TRIAGE_PREBUILT", None)
    tree = wheelbuild._source_tree(tmp_path / "src")  # what the sdist holds, not this checkout's build/
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(tree)], env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    assert "installed without its registration interposer" in built.stdout + built.stderr
    wheel = next((tmp_path / "dist").glob("gpuwarden-*.whl"))
    assert "gpuwarden/ops/engines/libgwpreload.so" not in zipfile.ZipFile(wheel).namelist()
    assert "triage's compiled line parser was not built" in built.stdout + built.stderr
    assert TRIAGE_EXT not in zipfile.ZipFile(wheel).namelist()
    py = _venv_with_test_deps(tmp_path / "venv")
    subprocess.run([*_pip_install(py), "--no-deps", str(wheel)], check=True, timeout=300)
    cfg = tmp_path / "node.toml"
    cfg.write_text('[[engines]]\nname = "dp0"\nargv = ["/bin/sleep", "60"]\nprogress = "preload"\n')
    run = lambda *a: subprocess.run([str(py), "-m", "gpuwarden", "--state-dir", str(tmp_path / "s"),  # noqa: E731
                                     "--backend", "sim", "--config", str(cfg), *a], cwd=tmp_path,
                                    capture_output=True, text=True, timeout=120)
    doctor = run("doctor", "--only", "interposer", "--json")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    check = json.loads(doctor.stdout)["checks"][0]
    assert check["verdict"] == "fail" and "dp0" in check["reason"] and "\n" not in check["reason"], check
    assert "not installed" in check["reason"] and "manylinux2014" in check["fix"] and "apt-get install gcc" in check["fix"]
    launch = run("launch", "--json")
    assert launch.returncode != 0 and "interposer" in launch.stdout + launch.stderr, launch.stdout + launch.stderr
    assert "apt-get install gcc" in launch.stdout + launch.stderr
    assert "Traceback" not in launch.stderr + doctor.stderr
    # triage takes its pure-Python parser and finds what the compiled one finds
    log = tmp_path / "kern.log"
    log.write_text("[  1.000000] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n")
    triage = run("triage", str(log), "--json")
    assert json.loads(triage.stdout)["findings"][0]["rule"] == "amdgpu.reset_begin", triage.stdout + triage.stderr
    which = subprocess.run([str(py), "-c", "from gpuwarden.ops.triage import lineparse; print(lineparse.COMPILED)"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert which.stdout.strip() == "False", which.stdout + which.stderr


def _pip_install(py: Path) -> list[str]:
    """This venv's pip installing into another environment (pip --python): a new venv needs no pip (ensurepip
    costs seconds). --no-compile: byte-compiling every installed module is not what these tests are about."""
    return [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--disable-pip-version-check",
            "--no-compile"]


def _venv_with_test_deps(where: Path) -> Path:
    """A fresh venv whose only borrowed packages are gpuwarden's dependencies (the test venv's site-packages as a
    plain path: its .pth files, the editable checkout's among them, are not read from there)."""
    import subprocess
    import sysconfig
    import venv
    venv.create(where, with_pip=False)
    py = where / "bin/python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "zz-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return py


PEERS = ("ops", "tui", "playbooks")
# What PyPI's ops requires that the test venv does not bring (websocket-client came with the official Kubernetes
# client until gpuwarden moved to lightkube).
OPS_NEEDS = ("opentelemetry-api", "websocket-client")


@pytest.fixture(scope="session")
def pypi_peers(tmp_path_factory) -> Path:
    """PyPI's ops, tui and playbooks, and ops' requirements the test venv lacks (OPS_NEEDS), as wheels
    in one folder: fetched (pip's cache) and built (tui is an sdist) once a session, then installed from there
    with --no-index by both orders."""
    import subprocess
    out = tmp_path_factory.mktemp("peers")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "-w", str(out), *PEERS, *OPS_NEEDS], check=True, timeout=600)
    return out


@pytest.mark.parametrize("order", ["theirs-first", "ours-first"])
def test_the_wheel_lives_beside_pypis_ops_tui_and_playbooks(wheels, pypi_peers, order, tmp_path):
    import subprocess
    py = _venv_with_test_deps(tmp_path / "venv")
    pip = [*_pip_install(py), "--no-index", "--find-links", str(pypi_peers)]
    # Their own files are what the test is about: with --no-deps pip does not resolve the test venv's whole set
    # again; ops' requirements the test venv lacks are installed beside them.
    theirs = [*pip, "--no-deps", *PEERS, *OPS_NEEDS]
    ours = [*pip, "--no-deps", str(wheels["x86_64"])]
    for argv in ([theirs, ours] if order == "theirs-first" else [ours, theirs]):
        subprocess.run(argv, check=True, timeout=300)
    run = lambda code: subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)  # noqa: E731
    status = subprocess.run([str(tmp_path / "venv/bin/gpuwarden"), "--state-dir", str(tmp_path / "s"), "--backend",
                             "sim", "status", "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert status.returncode == 0 and json.loads(status.stdout)["gpus"], status.stderr
    # PyPI's tui (1.1.1) is Python 2 code that no Python 3 imports: its files must merely stay whole
    # PyPI's playbooks needs a dozen services' clients (langfuse, ...) to import: installed --no-deps, its files
    # are checked like tui's; ops.charm is imported.
    theirs_ok = ("import ops.charm, importlib.metadata as m; print(ops.charm.CharmBase.__name__); "
                 "missing = [str(f) for d in ('ops', 'tui', 'playbooks') for f in m.distribution(d).files "
                 "if not f.locate().exists()]; assert not missing, missing")
    proc = run(theirs_ok)
    assert proc.returncode == 0 and "CharmBase" in proc.stdout, proc.stderr
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "uninstall", "-q", "-y", "gpuwarden"],
                   check=True, timeout=120)
    proc = run(theirs_ok)
    assert proc.returncode == 0 and "CharmBase" in proc.stdout, proc.stderr
    assert run("import gpuwarden.ops").returncode != 0
