"""doctor's module-options and runtime-env checks (ops/doctor/checks/knobs.py) on real files under a temp root, the
knob lists they compare with (ops/knowledge/knobs.toml), and the deploy/ examples checked against the same lists.

The residual-VRAM write-up's lines are the test input: `options kfd memory_policy=2`, `options amdgpu gpu_recovery=1`,
`virtual_display=0`, `sched_jobs=32`, HIP_HOST_FREE_MEMORY and HSA_AMD_SDMA_RESERVE_MEM in a tenant env.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from helpers.paths import REPO
from helpers.doctor_tree import healthy_node
from gpuwarden.ops.doctor.diagnose import diagnose
from gpuwarden.ops.doctor.probe import Probe
from gpuwarden.ops.doctor.runner import run_checks, select
from gpuwarden.ops.doctor.checks import REGISTRY
from gpuwarden.ops.knowledge import knobs, load
from helpers.sysfs_tree import write

FIXTURES = REPO / "tests" / "fixtures" / "dmesg"
# /etc/modprobe.d as the write-up has it, plus a real option, a comment and a continuation line
ARTICLE_CONF = """# residual VRAM fixes (from the incident write-up)
options kfd memory_policy=2
options amdgpu gpu_recovery=1 virtual_display=0 \\
    sched_jobs=32
options amdgpu lockup_timeout=10000  # a real one
options snd_hda_intel power_save=0
"""
LOADED = ("gpu_recovery", "virtual_display", "sched_jobs", "lockup_timeout", "no_system_mem_limit", "cwsr_enable",
          "gttsize")


def _node(tmp_path: Path, *, loaded: bool = True, conf: str | None = ARTICLE_CONF):
    settings = healthy_node(tmp_path, gpus=1)  # the simulated platform's amdgpu and ttm parameters, at defaults
    params = settings.sysfs_root / "module/amdgpu/parameters"
    if loaded:
        for name in LOADED:
            if not (params / name).exists():
                write(params / name, "0\n")
    else:
        shutil.rmtree(params)
    if conf is not None:
        write(settings.etc_root / "modprobe.d/residual-vram.conf", conf)
        write(settings.etc_root / "modprobe.d/ignored.conf.bak", "options amdgpu memory_policy=1\n")  # not *.conf
    return settings


def _run(settings, check: str, **extra):
    report = run_checks(select(list(REGISTRY), [check]), Probe(settings, live=False, extra=extra))
    return report.findings[0]


def _by_name(finding) -> dict[str, dict]:
    return {f"{o['module']}.{o['param']}": o for o in finding.details["options"]}


def test_the_write_ups_options_that_do_nothing_are_named_with_their_entries_and_gpu_recovery_is_not(tmp_path):
    f = _run(_node(tmp_path), "module-options")
    opts = _by_name(f)
    assert f.verdict == "warn"
    assert opts["kfd.memory_policy"]["status"] == "no-module"
    assert opts["kfd.memory_policy"]["entry"] == "myth-kfd-memory-policy"
    assert opts["amdgpu.virtual_display"]["status"] == "no-effect"
    assert opts["amdgpu.virtual_display"]["entry"] == "myth-amdgpu-virtual-display-0"
    assert opts["amdgpu.sched_jobs"]["status"] == "no-effect"  # joined from the continuation line
    assert opts["amdgpu.sched_jobs"]["where"] == "/etc/modprobe.d/residual-vram.conf:3"
    for real in ("amdgpu.gpu_recovery", "amdgpu.lockup_timeout"):
        assert opts[real]["status"] == "real" and opts[real]["entry"] is None, real
    assert "gpu_recovery" not in f.reason and "snd_hda_intel" not in str(f.details)
    assert "memory_policy=1" not in str(f.details)  # a .bak file is not read by modprobe either
    assert set(f.details["entries"]) == {"myth-kfd-memory-policy", "myth-amdgpu-virtual-display-0",
                                         "myth-amdgpu-sched-jobs-32"}
    assert "/etc/modprobe.d/residual-vram.conf" in f.fix
    assert "gpuwarden known myth-kfd-memory-policy" in f.reason
    cat = load()
    for entry in f.details["entries"]:
        assert cat.get(entry) is not None and cat.get(entry).kind == "myth", entry


def test_an_unknown_parameter_the_kernel_logged_as_ignored(tmp_path):
    # tunaOS#103: amdgpu built without SI/CIK support ignores si_support/cik_support from a file this check does not
    # read (/usr/lib/modprobe.d); the source list knows both names, the kernel log is what says they did nothing
    settings = _node(tmp_path, conf="options amdgpu si_support=1 gpu_recovery=1\n")
    log = FIXTURES / "tunaos103_amdgpu_unknown_parameter_si_cik_support_ignored.log"
    f = _run(settings, "module-options", kernel_log=str(log))
    opts = _by_name(f)
    assert f.verdict == "warn" and f.details["kernel_log"] == str(log)
    assert opts["amdgpu.si_support"]["status"] == "unknown-parameter" and opts["amdgpu.si_support"]["ignored_in_kernel_log"]
    assert opts["amdgpu.cik_support"]["where"].startswith("kernel log")  # set outside /etc/modprobe.d
    assert opts["amdgpu.cik_support"]["entry"] == "module-unknown-parameter-ignored"
    assert opts["amdgpu.gpu_recovery"]["status"] == "real"


def test_a_real_command_line_passes_and_a_misspelt_one_does_not(tmp_path):
    # ROCm#5671: a Debian 13 command line whose amdgpu/ttm options are all real parameters
    line = (FIXTURES / "rocm5671_debian_command_line_amdgpu_ttm_options.log").read_text()
    settings = _node(tmp_path, conf=None)
    write(settings.proc_root / "cmdline", line.split("Command line: ", 1)[1])
    f = _run(settings, "module-options")
    assert f.verdict == "pass", f.reason
    assert {o["where"] for o in f.details["options"]} == {"kernel command line"}
    assert sorted(_by_name(f)) == ["amdgpu.cwsr_enable", "amdgpu.gttsize", "ttm.pages_limit"]
    write(settings.proc_root / "cmdline", "ro amdgpu.gpu_recovery=1 ttm.pages_limt=16777216\n")
    f = _run(settings, "module-options")
    assert f.verdict == "warn" and _by_name(f)["ttm.pages_limt"]["status"] == "unknown-parameter"
    assert "ttm.pages_limt=16777216 (kernel command line: ttm has no parameter 'pages_limt'" in f.reason


def test_without_the_module_loaded_the_source_list_decides_and_says_so(tmp_path):
    settings = _node(tmp_path, loaded=False, conf="options amdgpu gpu_recovery=1 memory_policy=2\n")
    f = _run(settings, "module-options")
    opts = _by_name(f)
    assert opts["amdgpu.gpu_recovery"]["status"] == "real"
    assert opts["amdgpu.memory_policy"]["entry"] == "myth-kfd-memory-policy"
    assert "amdgpu is not loaded: the source list of ROCm/amdgpu" in opts["amdgpu.memory_policy"]["why"]


def test_a_kfd_option_that_amdgpu_has_says_where_it_belongs(tmp_path):
    settings = _node(tmp_path, conf="options amdkfd cwsr_enable=0\n")
    f = _run(settings, "module-options")
    opt = _by_name(f)["amdkfd.cwsr_enable"]
    assert opt["status"] == "no-module" and opt["entry"] == "myth-kfd-module-options"
    assert "set amdgpu.cwsr_enable" in opt["why"]


def test_no_options_at_all_pass_and_the_healthy_node_stays_green(tmp_path):
    settings = _node(tmp_path, conf=None)
    report = diagnose(settings)
    f = next(x for x in report.findings if x.id == "module-options")
    assert f.verdict == "pass" and f.details["options"] == []
    assert report.exit_code == 0


ENV_CONFIG = """[[engines]]
name = "tenant-a"
gpu = 0
argv = ["/bin/sleep", "600"]
env = {{ {env} }}
"""


def test_runtime_env_names_the_variables_no_runtime_reads(tmp_path):
    settings = healthy_node(tmp_path, gpus=1)
    settings.config_path.write_text(ENV_CONFIG.format(env=(
        'HIP_HOST_FREE_MEMORY = "1", HSA_AMD_SDMA_RESERVE_MEM = "0", HSA_XNACK = "0", HIP_VISIBLE_DEVICES = "0", '
        'HSA_OVERRIDE_GFX_VERSION = "11.0.0", HIP_PATH = "/opt/rocm", NCCL_DEBUG = "INFO", HSA_ENABLE_SDMAA = "0"')))
    f = _run(settings, "runtime-env")
    assert f.verdict == "warn"
    unread = {v["name"]: v["entry"] for v in f.details["unread"]}
    assert unread == {"HIP_HOST_FREE_MEMORY": "myth-hip-host-free-memory",
                      "HSA_AMD_SDMA_RESERVE_MEM": "myth-hsa-amd-sdma-reserve-mem",
                      "HSA_ENABLE_SDMAA": "runtime-env-unread"}
    assert "in engine tenant-a" in f.reason and str(settings.config_path) in f.fix
    settings.config_path.write_text(ENV_CONFIG.format(env='HSA_XNACK = "0", NCCL_DEBUG = "INFO"'))
    f = _run(settings, "runtime-env")
    assert f.verdict == "pass" and f.details["judged"] == 1


def test_runtime_env_without_a_config_is_skipped(tmp_path):
    assert _run(healthy_node(tmp_path, gpus=1), "runtime-env").verdict == "skip"


def _env_names(text: str) -> set[str]:
    """Environment variable names a manifest sets: `- name: X` lists and `{name: X, value: ...}` / CEL objects."""
    return set(re.findall(r"""\bname\W{1,3}\s*["']?([A-Z][A-Z0-9_]+)\b""", text))


def test_the_deploy_examples_set_no_variable_that_no_runtime_reads():
    files = [REPO / "deploy/k8s/tenant-example.yaml", *sorted((REPO / "deploy/k8s/admission").rglob("*.yaml"))]
    names = set().union(*(_env_names(p.read_text()) for p in files))
    assert "HOST_IP" in names  # the scan sees what the examples inject (the gate's address, from the downward API)
    from gpuwarden.ops.doctor.checks.knobs import unread_vars
    assert unread_vars(sorted(names)) == []
    assert [n for n, _, _ in unread_vars(["HIP_HOST_FREE_MEMORY", "GPUWARDEN_STATE_DIR"])] == ["HIP_HOST_FREE_MEMORY"]


def test_every_entry_the_knob_lists_name_exists_and_says_what_to_do():
    kb = knobs.load()
    cat = load()
    named = ({n["entry"] for n in kb.noop.values()} | {a["entry"] for a in kb.absent_modules.values()}
             | set(kb.param_myths.values()) | set(kb.env_myths.values())
             | {"module-unknown-parameter-ignored", "runtime-env-unread"})
    for entry in named:
        e = cat.get(entry)
        assert e is not None and e.workaround, entry
    for module, m in kb.modules.items():
        assert m["source"].startswith("https://") and m["version"] and m["params"], module
    assert "gpu_recovery" in kb.module_params("amdgpu") and "memory_policy" not in kb.module_params("amdgpu")
    for name, r in kb.runtimes.items():
        assert r["source"].startswith("https://") and r["vars"], name
    for myth in kb.env_myths:  # a myth variable must really be unread, or the list contradicts itself
        assert kb.judged(myth) and kb.reader_of(myth) is None, myth
