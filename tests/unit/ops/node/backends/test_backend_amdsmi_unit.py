"""The unit half of tests/integration/ops/node/backends/test_backend_amdsmi.py (its tests that need no process, socket or server); the pair's subject:
The amdsmi backend: one clear line without the library, and the contract with amdsmi 6.1, 6.2 and
7.0.2 checked through a stand-in built from each version's real signatures, replaying captured amd-smi output.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest

from gpuwarden.ops.node.backends import amdsmi_backend, libload
from gpuwarden.ops.node.backends.amdsmi_backend import AmdSmiBackend, known, number
from gpuwarden.ops.foundation.errors import BackendUnavailable
from standins import amd_smi_capture as capture
from standins import amdsmi_standin as standin
from standins.extract_amdsmi_api import extract
from helpers.sysfs_tree import add_card, add_kfd_node
from helpers.paths import REPO

GIB = 1 << 30
BACKEND_SRC = REPO / "ops/node/backends/amdsmi_backend.py"


@pytest.fixture
def open_replay(settings, tmp_path):
    """open_replay(version, node) -> (backend, stand-in module); every backend is closed afterwards."""
    opened = []
    # An empty sysfs root: the sysfs fallbacks must find nothing rather than read this machine's /sys.
    settings = settings.with_(sysfs_root=tmp_path / "sys", dev_root=tmp_path / "dev")

    def make(version, node, **kw):
        mod = standin.build(version, node, **kw)
        backend = AmdSmiBackend(settings, module=mod)
        opened.append(backend)
        return backend, mod
    yield make
    for b in opened:
        b.close()


def test_without_libamd_smi_it_says_so_in_one_line(settings, capfd):
    libload.forget_failures()  # this machine has the amdsmi wheel but no libamd_smi.so
    with pytest.raises(BackendUnavailable) as err:
        AmdSmiBackend(settings)
    assert err.value.message == "amdsmi: libamd_smi.so not found"
    assert "amd-smi-lib" in err.value.hint
    out, errout = capfd.readouterr()
    assert out == "" and errout == ""  # the wheel's own print() must not leak into `status --json`


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_monitor_capture_mi300x_rocm640(version, open_replay, fixtures):
    node = capture.monitor_node(fixtures / "amd-smi/amd_smi_monitor_process_rocm640.txt")
    backend, mod = open_replay(version, node)
    [gpu] = backend.gpus()
    # amd-smi printed "3.1/191.7 GB" (binary GB, one decimal): bytes from memory_usage/total
    assert gpu.vram_used == pytest.approx(3.1 * GIB, abs=0.05 * GIB)
    assert gpu.vram_total == pytest.approx(191.7 * GIB, abs=0.05 * GIB)
    assert (gpu.busy_percent, gpu.temperature_c, gpu.power_w) == (96.0, 49.0, 293.0)
    assert gpu.vendor == "amd" and gpu.name == "AMD GPU 0"  # market_name was not captured: "N/A"
    assert gpu.gtt_total is None and gpu.gtt_used is None and gpu.bus_id is None and gpu.uuid is None
    assert gpu.hive_id is None and gpu.kfd_gpu_id is None and gpu.device_files == ()
    [proc] = backend.process_usage()
    assert (proc.pid, proc.gpu_index, proc.source, proc.gtt_bytes) == (2266127, 0, "amdsmi", 0)
    assert proc.vram_bytes == pytest.approx(2.8 * GIB, abs=0.05 * GIB)
    two_step = version in ("rocm-6.0.0", "rocm-6.1.0")
    assert ("amdsmi_get_gpu_process_info" in mod.calls) == two_step


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_vram_in_mib_when_byte_counters_fail(version, open_replay, fixtures):
    node = capture.monitor_node(fixtures / "amd-smi/amd_smi_monitor_mi300x_class_rocm640.txt")
    backend, mod = open_replay(version, node)
    # Make the byte-counting calls fail the way an unsupported call does: the MiB call must take over.
    mod.amdsmi_get_gpu_memory_usage = mod.amdsmi_get_gpu_memory_total = _raises_unsupported(mod)
    backend = AmdSmiBackend(backend._settings, module=mod)
    try:
        [gpu] = backend.gpus()
    finally:
        backend.close()
    assert gpu.vram_used == 3072 * (1 << 20)  # "3.0 GB" = 3072 MiB, scaled from MiB to bytes
    assert gpu.vram_total == pytest.approx(191.7 * GIB, abs=1 << 20)
    assert "amdsmi_get_gpu_vram_usage" in mod.calls


def _raises_unsupported(mod):
    def fail(processor_handle, *args):
        raise mod.AmdSmiLibraryException(standin.NOT_SUPPORTED)
    return fail


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_gpu_metrics_answers_what_the_dedicated_calls_cannot(version, settings, fixtures):
    node = capture.monitor_node(fixtures / "amd-smi/amd_smi_monitor_process_rocm640.txt")
    mod = standin.build(version, node)
    for name in ("amdsmi_get_gpu_activity", "amdsmi_get_power_info", "amdsmi_get_temp_metric"):
        setattr(mod, name, _raises_unsupported(mod))
    backend = AmdSmiBackend(settings, module=mod)
    try:
        [gpu] = backend.gpus()
        backend.gpus()
    finally:
        backend.close()
    # 6.1's table has only average_socket_power; 6.2+ carry current_socket_power (what amd-smi shows)
    assert (gpu.busy_percent, gpu.temperature_c, gpu.power_w) == (96.0, 49.0, 293.0)
    assert mod.calls.count("amdsmi_get_gpu_metrics_info") == 2  # once per refresh, not once per field


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_four_mi300x_from_rocm_smi_all(version, open_replay, fixtures):
    node = capture.rocm_smi_all_node(fixtures / "rocm-smi/rocm_smi_showallinfo_a_4x_mi300x.txt")
    backend, _ = open_replay(version, node)
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert {g.name for g in gpus} == {"AMD Instinct MI300X OAM"}
    assert [g.bus_id for g in gpus] == ["0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0"]
    assert [g.temperature_c for g in gpus] == [35.0, 37.0, 34.0, 39.0]  # junction = hotspot
    assert [g.power_w for g in gpus] == [133.0, 130.0, 131.0, 136.0]
    assert [g.busy_percent for g in gpus] == [0.0] * 4
    assert all(g.vram_used is None for g in gpus)  # not in that capture: unknown, not 0
    assert backend.process_usage() == []


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_static_capture_mi350x_and_nothing_else_known(version, open_replay, fixtures):
    node = capture.static_node(fixtures / "amd-smi/amd_smi_static_text_mi350x_truncated.txt")
    backend, _ = open_replay(version, node)
    [gpu] = backend.gpus()
    assert gpu.name == "AMD Instinct MI350X" and gpu.bus_id == "0000:05:00.0"
    assert (gpu.vram_used, gpu.busy_percent, gpu.temperature_c, gpu.power_w) == (None, None, None, None)


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_process_text_with_name_na(version, open_replay, fixtures):
    node = capture.process_text_node(fixtures / "amd-smi/amd_smi_process_text_name_na_rocm640.txt")
    backend, _ = open_replay(version, node)
    [proc] = backend.process_usage()
    assert proc.pid == 2266127 and proc.gtt_bytes == 0
    assert proc.vram_bytes == pytest.approx(1.9 * GIB, abs=0.05 * GIB)


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_process_json_rocm63_falls_back_to_mem(version, open_replay, fixtures):
    node = capture.process_json_node(
        fixtures / "amd-smi/amd_smi_process_json_rocm63_changelog_transferbench_rvs.json")
    backend, _ = open_replay(version, node)
    usage = backend.process_usage()
    assert [(u.pid, u.vram_bytes, u.gtt_bytes) for u in usage] == [(420157, 0, None), (420315, 0, None)]


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_render_node_and_kfd_gpu_id_from_sysfs_without_enumeration_info(version, open_replay, fixtures, tmp_path):
    # Synthesised layout (the capture has only the BDF): card1 at 0000:05:00.0 with renderD129, and
    # a KFD node whose location_id encodes the same address (bus 5 << 8).
    node = capture.static_node(fixtures / "amd-smi/amd_smi_static_text_mi350x_truncated.txt")
    sys_root = tmp_path / "sys"
    add_card(sys_root, 1, vram_total="0\n", vram_used="0\n", bus="0000:05:00.0", render_minor=129)
    add_kfd_node(sys_root, 2, 48245, "location_id 1280\ndomain 0\n")
    backend, _ = open_replay(version, node)
    [gpu] = backend.gpus()
    assert gpu.device_files == (str(tmp_path / "dev/dri/renderD129"),)
    assert gpu.kfd_gpu_id == 48245
    assert backend.device_globs() == [str(tmp_path / "dev/kfd"), str(tmp_path / "dev/dri/renderD*")]


@pytest.mark.parametrize("version", ["rocm-6.1.0", "amdsmi-7.0.2"])
@pytest.mark.parametrize("code, clause", [
    (standin.NO_PERM, "no permission to open the GPU (add the user to the render and video groups)"),
    (standin.DRIVER_NOT_LOADED, "amdgpu driver not loaded"),
    (standin.NOT_SUPPORTED, "amdsmi_init failed (AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported)"),
])
def test_init_failures_become_one_clause(version, code, clause, settings, fixtures):
    node = capture.static_node(fixtures / "amd-smi/amd_smi_static_text_mi350x_truncated.txt")
    mod = standin.build(version, node, init_error=code)
    with pytest.raises(BackendUnavailable) as err:
        AmdSmiBackend(settings, module=mod)
    assert err.value.message == f"amdsmi: {clause}"


def test_the_pre_rocm6_api_is_refused_in_one_line(settings, fixtures):
    node = capture.static_node(fixtures / "amd-smi/amd_smi_static_text_mi350x_truncated.txt")
    mod = standin.build(standin.TOO_OLD, node)
    with pytest.raises(BackendUnavailable) as err:
        AmdSmiBackend(settings, module=mod)
    assert err.value.message == ("amdsmi: this amdsmi predates the ROCm 6.0 API "
                                 "(no AmdSmiInitFlags.INIT_AMD_GPUS, amdsmi_get_gpu_device_bdf, "
                                 "amdsmi_get_gpu_device_uuid, ...)")
    assert mod.calls == []  # refused before touching the library


def test_a_failed_import_is_tried_once(settings):
    libload.forget_failures()
    raised = []
    for _ in range(2):
        with pytest.raises(BackendUnavailable) as err:
            AmdSmiBackend(settings)
        raised.append(err.value)
    assert raised[0] is raised[1]  # the second attempt is answered from the remembered failure


def test_close_shuts_the_library_down_once(open_replay, fixtures):
    node = capture.static_node(fixtures / "amd-smi/amd_smi_static_text_mi350x_truncated.txt")
    backend, mod = open_replay("amdsmi-7.0.2", node)
    backend.close()
    backend.close()
    assert mod.calls.count("amdsmi_shut_down") == 1


def _called_names() -> tuple[set[str], set[str]]:
    """amdsmi names the backend uses: (reached directly as m.<name>, looked up with getattr)."""
    # The backend and the sensor reader it calls.
    tree = ast.parse(BACKEND_SRC.read_text() + "\n" + BACKEND_SRC.with_name("amdsmi_sensors.py").read_text())
    direct, optional = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith(("amdsmi_", "AmdSmi")):
            direct.add(node.attr)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(
                r"(amdsmi_\w+|AmdSmi\w+)", node.value):
            optional.add(node.value)
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    return direct - own, optional - own


@pytest.mark.parametrize("version", standin.VERSIONS)
def test_every_name_the_backend_uses_exists_in_the_real_api(version):
    api = standin.load_api(version)
    known_names = set(api["functions"]) | set(api["enums"]) | set(api["exceptions"])
    direct, optional = _called_names()
    assert direct, "the AST scan found nothing: the test is broken"
    # Reached without a fallback: must exist in every supported version.
    assert direct <= known_names, sorted(direct - known_names)
    everywhere = set.union(*(set(standin.load_api(v)["functions"]) | set(standin.load_api(v)["enums"])
                             | set(standin.load_api(v)["exceptions"]) for v in standin.VERSIONS))
    # Looked up with getattr: may be missing in one version, but must exist in some (no typos).
    assert optional <= everywhere, sorted(optional - everywhere)
    # Whatever is reached directly is checked at open, so an older library is refused, not crashed on.
    assert direct - {"AmdSmiInitFlags"} <= set(amdsmi_backend._REQUIRED)


def test_installed_wheel_keeps_the_contract_the_backend_relies_on():
    """The amdsmi wheel pip installed (any version >= 6.2) still has every function the backend calls,
    with parameters of a version the stand-ins cover; the 7.0.2 wheel matches its stored API exactly."""
    spec = importlib.util.find_spec("amdsmi")  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations, "amdsmi wheel not installed"
    fresh = extract(Path(list(spec.submodule_search_locations)[0]), "installed")
    names = set(fresh["functions"]) | set(fresh["enums"]) | set(fresh["exceptions"])
    direct, optional = _called_names()
    assert direct <= names, f"the installed amdsmi lacks {sorted(direct - names)}"
    stored = [standin.load_api(v) for v in standin.VERSIONS]
    for name in sorted((direct | optional) & set(fresh["functions"])):
        params = fresh["functions"][name]["params"]
        assert any(api["functions"].get(name, {}).get("params") == params for api in stored), (
            f"{name}{[p['name'] for p in params]} differs from every stored API: extract this version "
            "with tests/standins/extract_amdsmi_api.py and add it to standin.VERSIONS")
    if importlib.metadata.version("amdsmi") == "7.0.2":
        assert {k: fresh[k] for k in ("functions", "enums", "exceptions")} == {
            k: standin.load_api("amdsmi-7.0.2")[k] for k in ("functions", "enums", "exceptions")}


def test_the_versions_differ_where_the_backend_says_they_do():
    v60, v61, v62, v702 = (standin.load_api(v) for v in standin.VERSIONS)
    assert "amdsmi_get_gpu_process_info" in v60["functions"]
    assert "amdsmi_get_gpu_process_info" in v61["functions"]
    assert "amdsmi_get_gpu_process_info" not in v62["functions"] | v702["functions"]
    assert "amdsmi_get_gpu_enumeration_info" in v702["functions"]
    assert "amdsmi_get_gpu_enumeration_info" not in v61["functions"] | v62["functions"]
    assert "amdsmi_get_gpu_kfd_info" in v702["functions"] and "amdsmi_get_gpu_kfd_info" not in v62["functions"]
    assert not v61["functions"]["amdsmi_get_power_info"]["says_na"]  # 6.1 leaves 0xFFFF in place
    assert v62["functions"]["amdsmi_get_power_info"]["says_na"]
    assert "socket_power" in v702["functions"]["amdsmi_get_power_info"]["returns_keys"]
    assert "socket_power" not in v62["functions"]["amdsmi_get_power_info"]["returns_keys"]
    for api in (v60, v61, v62, v702):
        assert "INIT_AMD_GPUS" in api["enums"]["AmdSmiInitFlags"]


def test_standin_rejects_what_the_real_library_rejects(fixtures):
    node = capture.static_node(fixtures / "amd-smi/amd_smi_static_text_mi350x_truncated.txt")
    mod = standin.build("amdsmi-7.0.2", node)
    [handle] = mod.amdsmi_get_processor_handles()
    with pytest.raises(standin.ContractViolation):
        mod.amdsmi_get_gpu_memory_usage(handle, 0)  # a plain int, not AmdSmiMemoryType
    with pytest.raises(standin.ContractViolation):
        mod.amdsmi_get_gpu_memory_usage(handle)  # wrong arity
    with pytest.raises(standin.ContractViolation):
        mod.amdsmi_get_gpu_asic_info(handle)["no_such_key"]
    assert not hasattr(mod, "amdsmi_get_gpu_process_info")  # gone in 7.x


@pytest.mark.parametrize("raw, expected", [
    ("N/A", None), ("", None), (0xFFFF, None), (0xFFFFFFFF, None), (0xFFFFFFFFFFFFFFFF, None),
    (255, 255), (0, 0), ("AMD Instinct MI300X", "AMD Instinct MI300X"), (None, None),
])
def test_known(raw, expected):
    assert known(raw) == expected


def test_number_reads_strings_and_rejects_words():
    assert number("12") == 12.0 and number(7) == 7 and number("hot") is None and number("N/A") is None
