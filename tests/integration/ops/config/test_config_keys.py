"""One declaration of the configuration keys (ops/config/keys.py): the docs' reference and `config example` are what
it generates, the sections' defaults are its defaults, every error of a file is reported at once with file:line,
and the loader applies defaults < node config < environment < command line the same on both of status's paths.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.cli import gpuwarden
from gpuwarden.ops.config import keys, loader, reference
from gpuwarden.ops.config.agent import AgentConfig
from gpuwarden.ops.config.kubernetes import KubernetesConfig
from gpuwarden.ops.config.nodeconfig import EngineConfig, StaggerConfig, parse
from gpuwarden.ops.foundation.errors import ConfigError, GpuwardenError
from gpuwarden.ops.foundation.paths import default_state_dir

DOC = REPO / "docs" / "configuration.md"
BEGIN, END = "<!-- generated from ops/config/keys.py: begin -->\n", "<!-- generated from ops/config/keys.py: end -->"


def test_the_docs_reference_is_what_the_table_generates():
    text = DOC.read_text()
    generated = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    assert generated == reference.markdown(), "run `python -m gpuwarden.ops.config.reference` and paste its tables"
    for k in keys.KEYS:  # every key is in the page, with its variable where it has one
        assert f"`{k.name}`" in generated or f"`{k.env}`" in generated, k


def test_config_example_is_generated_from_the_table_and_loads(tmp_path):
    proc = gpuwarden("config", "example")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == reference.example(4)
    for k in keys.KEYS:  # each key the example sets carries the table's help as its comment
        if k.example is not None and k.section not in ("global",):
            assert f"{k.name} = {k.example}" in proc.stdout, k
    path = tmp_path / "node.toml"
    path.write_text(proc.stdout)
    cfg = parse(proc.stdout, path)
    assert [e.gpu for e in cfg.engines] == [0, 1, 2, 3] and cfg.arena.size == 64 << 30


def test_each_sections_defaults_are_the_tables():
    for section, obj in (("agent", AgentConfig()), ("kubernetes", KubernetesConfig()), ("stagger", StaggerConfig())):
        for name, k in keys.section(section).items():
            assert getattr(obj, name) == k.default, (section, name)
    engine = EngineConfig(name="e", argv=("x",))
    for name, k in keys.section("engines").items():
        if not k.required:
            assert getattr(engine, name) == k.default, name


def test_every_error_of_every_section_at_once_with_file_and_line():
    """[agent] and [kubernetes] stopped at their first error (one fix, one run, the next error): now each is named."""
    text = ('[arena]\npath = "relative.arena"\n'          # 1-2
            '[agent]\ninterval = 0.1\nkmsg = ""\n'           # 3-5
            '[kubernetes]\ntaint_after = "soon"\npolicy = "sometimes"\nremediation_slots = 0\n'  # 6-9
            '[[engines]]\nname = "a"\nargv = ["x"]\nstop_signal = "SIGFOO"\n')  # 10-13
    with pytest.raises(ConfigError) as err:
        parse(text, Path("/etc/gpuwarden/node.toml"))
    lines = [e.message for e in err.value.errors]
    assert [int(re.match(r"/etc/gpuwarden/node.toml:(\d+): ", m).group(1)) for m in lines] == [2, 4, 5, 7, 8, 9, 13]
    assert lines[1].endswith("agent.interval: must be a duration of at least 0.25s, got 0.1")
    assert lines[3].endswith("kubernetes.taint_after: cannot read duration 'soon'")
    assert lines[6].endswith("engines[0].stop_signal: unknown signal 'SIGFOO'")
    assert "(and 6 more" in err.value.message


def test_config_check_prints_every_agent_error(tmp_path, cli):
    path = tmp_path / "node.toml"
    path.write_text('[agent]\ninterval = "soon"\nevents_max = "lots"\nbundle_on = ["never"]\n')
    proc = cli("--config", str(path), "config", "check")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("gpuwarden: error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [e.split(": ")[2] for e in errors] == [f"{path}:2", f"{path}:3", f"{path}:4"], proc.stderr


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", ["default", "file", "env", "option", "broken-elsewhere", "bad-state-dir", "no-toml"])
def test_state_dir_layers_and_the_cheap_path_agrees(tmp_path, case):
    """defaults < file < environment < option, and loader.state_dir (status --json's way to the agent's socket)
    picks what loader.resolve picks, or None where the full path must say why the config does not read."""
    config = tmp_path / "node.toml"
    opts: dict[str, object] = {"config": config}
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    want: Path | None = None
    if case == "default":
        want = Path(tmp_path / "run" / "gpuwarden") if os.geteuid() else Path("/run/gpuwarden")
    if case in ("file", "env", "option", "broken-elsewhere"):
        _write(config, f'state_dir = "{tmp_path / "file"}"\n' + ("[stagger]\nslots = 0\n" if case == "broken-elsewhere"
                                                                  else ""))
        want = tmp_path / "file"
    if case in ("env", "option"):
        env["GPUWARDEN_STATE_DIR"] = str(tmp_path / "env")
        want = tmp_path / "env"
    if case == "option":
        opts["state_dir"] = tmp_path / "opt"
        want = tmp_path / "opt"
    if case == "bad-state-dir":
        _write(config, 'state_dir = "relative"\n')
    if case == "no-toml":
        _write(config, "state_dir = \n")
    full = loader.resolve(opts, env, check=False).state_dir
    cheap = loader.state_dir(opts, env)
    if want is None:  # the cheap path leaves it to the full one, which keeps the default and lets the load say it
        assert cheap is None and full == Path(tmp_path / "run" / "gpuwarden" if os.geteuid() else "/run/gpuwarden")
    else:
        assert full == cheap == want


def test_every_wrong_global_option_is_reported_together(tmp_path):
    proc = gpuwarden("--state-dir", str(tmp_path), "--backend", "cuda", "--read-timeout", "soon",
                     "--sysfs-root", str(tmp_path / "nowhere"), "status", "--json")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("gpuwarden: error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert errors == ["gpuwarden: error: unknown backend 'cuda'",
                      "gpuwarden: error: --read-timeout 'soon' is not a number of seconds",
                      f"gpuwarden: error: --sysfs-root {tmp_path / 'nowhere'} is not a directory"], proc.stderr


def test_the_environment_is_read_through_the_table(tmp_path):
    env = {"GPUWARDEN_READ_TIMEOUT": "7", "GPUWARDEN_DEV_ROOT": str(tmp_path), "GPUWARDEN_BACKEND": "auto",
           "GPUWARDEN_CONFIG": str(tmp_path / "none.toml"), "GPUWARDEN_STATE_DIR": str(tmp_path)}
    s = loader.resolve({"read_timeout": "2"}, env, check=False)
    assert (s.read_timeout_s, s.dev_root, s.backend, s.config_path) == (2.0, tmp_path, None, tmp_path / "none.toml")
    with pytest.raises(GpuwardenError, match=r"GPUWARDEN_READ_TIMEOUT='x' is not a number of seconds"):
        loader.resolve({}, {**env, "GPUWARDEN_READ_TIMEOUT": "x"}, check=False)
    assert loader.resolve({}, {"XDG_RUNTIME_DIR": str(tmp_path)}, check=False).state_dir == \
        (tmp_path / "gpuwarden" if os.geteuid() else default_state_dir())


def test_one_signal_parser_and_one_refresh_floor():
    from gpuwarden.ops import canary
    from gpuwarden.ops.config.nodeconfig import signal_number
    from gpuwarden.ops.node import procs
    from gpuwarden.ops.sampling import thread
    from gpuwarden.tui import command
    for name in ("SIGTERM", "term", " Int ", "KILL"):
        n = int(signal.Signals["SIG" + name.strip().upper().removeprefix("SIG")])
        assert signal_number(name) == canary._signal_number(name) == procs.signal_number(name.strip().upper()) == n
    with pytest.raises(GpuwardenError, match="unknown signal 'SIGFOO'"):
        canary._signal_number("foo")
    assert thread.MIN_REFRESH_S is command.MIN_REFRESH_S is keys.MIN_REFRESH_S
    assert keys.key("agent", "interval").low == keys.MIN_REFRESH_S


def test_the_roots_options_read_the_tables_variables():
    """The Typer root declares each global option with its variable (Typer reads it first): the same as the table."""
    import typer

    from gpuwarden.playbooks.cli.root import build_app
    params = {opt: p for p in typer.main.get_command(build_app()).params for opt in p.opts}
    for k in keys.KEYS:
        if k.option:
            assert params[k.option].envvar == k.env, k
