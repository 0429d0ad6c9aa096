"""gpuwarden as a user gets it: the manylinux wheels, and the OCI image, on a Debian with no C compiler.

The wheels are built by deploy/wheel/build.py (zig against glibc 2.17) and the image's root fs by
deploy/container/build.py (mmdebstrap, cached between sessions under ~/.cache/gpuwarden-build); each is
built once a session. Inside the root fs (unshare + chroot) the installed wheel runs its CLI and its
interposer, which is preloaded into an unmodified stand-in engine.
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

from conftest import REPO
from engines.preload_harness import SIZE, events, phases

sys.path.insert(0, str(REPO / "deploy" / "wheel"))
import build as wheelbuild  # noqa: E402  (deploy/wheel/build.py; the container's imports it too)

import gpuwarden.ops  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first build of the root fs downloads it
VERSION = gpuwarden.ops.__version__
ELF_MACHINE = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}


def _need(*tools: str) -> None:
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        pytest.skip(f"needs {', '.join(absent)} (tests/run-all.sh installs them)")


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("ziglang", reason="the wheels are cross-built with PyPI's ziglang (test extra)")
    out = tmp_path_factory.mktemp("dist")
    return {arch: wheelbuild.build_wheel(arch, out) for arch in wheelbuild.ARCHES}


def _library(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        z.extract("gpuwarden/ops/engines/libgwpreload.so", into)
    return into / "gpuwarden/ops/engines/libgwpreload.so"


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
    lib = _library(wheel, tmp_path)
    from elftools.elf.elffile import ELFFile
    with lib.open("rb") as f:
        elf = ELFFile(f)
        assert elf["e_machine"] == ELF_MACHINE[arch] and elf["e_type"] == "ET_DYN"
        assert elf.get_section_by_name(".debug_info") is None  # shipped stripped
    versions = glibc_versions(lib)
    assert versions and max(versions) <= (2, 17), sorted(versions)


@pytest.fixture(scope="session")
def image_root(wheels, tmp_path_factory) -> Path:
    _need("mmdebstrap", "unshare", "chroot")
    image = _container()
    root = tmp_path_factory.mktemp("image") / "root"
    return image.rootfs(wheels["x86_64"], root, image.default_cache(), image.default_pip_cache())


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


def test_the_oci_image_is_tagged_with_the_version(image_root, tmp_path):
    _need("umoci")
    image = _container()
    archive = image.oci(image_root, tmp_path, VERSION)
    assert archive.name == f"gpuwarden-{VERSION}.oci.tar" and archive.stat().st_size > 0
    size = image.image_size(tmp_path / "oci", VERSION)
    assert 10e6 < size < 200e6, size  # RESULTS.md states it; no compiler, no test deps


def test_a_source_install_without_a_compiler_has_all_but_the_interposer_and_says_so(tmp_path):
    # the sdist's build with no C compiler to be found: setup.py must warn, not fail
    import subprocess
    import venv
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    env.pop("GPUWARDEN_PRELOAD_PREBUILT", None)
    tree = wheelbuild._source_tree(tmp_path / "src")  # what the sdist holds, not this checkout's build/
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(tree)], env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    assert "installed without its registration interposer" in built.stdout + built.stderr
    wheel = next((tmp_path / "dist").glob("gpuwarden-*.whl"))
    assert "gpuwarden/ops/engines/libgwpreload.so" not in zipfile.ZipFile(wheel).namelist()
    venv.create(tmp_path / "venv", with_pip=True)
    py = tmp_path / "venv/bin/python"
    # the dependencies come from the test's own venv: its site-packages as a plain path (its .pth files, the
    # editable checkout's among them, are not read from there)
    import sysconfig
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
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


def _venv_with_test_deps(where: Path) -> Path:
    """A fresh venv whose only borrowed packages are gpuwarden's dependencies (the test venv's site-packages as a
    plain path: its .pth files, the editable checkout's among them, are not read from there)."""
    import subprocess
    import sysconfig
    import venv
    venv.create(where, with_pip=True)
    py = where / "bin/python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "zz-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return py


@pytest.mark.parametrize("order", ["theirs-first", "ours-first"])
def test_the_wheel_lives_beside_pypis_ops_tui_and_playbooks(wheels, order, tmp_path):
    import subprocess
    py = _venv_with_test_deps(tmp_path / "venv")
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]  # the user's pip cache keeps it fast
    # Their own files are what the test is about: with --no-deps pip does not resolve the test venv's whole set
    # again (three minutes an order); ops' one requirement the test venv lacks is installed beside them.
    subprocess.run([*pip, "opentelemetry-api"], check=True, timeout=300)
    theirs = [*pip, "--no-deps", "ops", "tui", "playbooks"]
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
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "gpuwarden"], check=True, timeout=120)
    proc = run(theirs_ok)
    assert proc.returncode == 0 and "CharmBase" in proc.stdout, proc.stderr
    assert run("import gpuwarden.ops").returncode != 0
