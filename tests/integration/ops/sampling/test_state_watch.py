"""A long-lived sampler reads the state files and the config only when inotify says their directories changed:
real directories, real writes (atomic replaces, in-place edits, a directory that comes later), real inotify.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuwarden.ops.foundation.dirwatch import DirWatch
from gpuwarden.ops.foundation.settings import Settings
from gpuwarden.ops.node import nodestate
from gpuwarden.ops.node.backends.sysfs import SysfsBackend
from gpuwarden.ops.node.sim.node import SimNode
from gpuwarden.ops.sampling import extras as extras_mod
from gpuwarden.ops.sampling.sampler import Sampler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _quiet(watch: DirWatch) -> bool:
    return not watch.changed()


def test_each_kind_of_change_is_seen_once_and_a_quiet_directory_is_quiet(tmp_path):
    clock = Clock()
    watch = DirWatch([tmp_path], clock=clock)
    try:
        assert watch.changed() and _quiet(watch) and _quiet(watch)  # the first ask reads; then nothing happened
        f = tmp_path / "drained.json"
        f.write_text("{}")
        assert watch.changed() and _quiet(watch)
        tmp = tmp_path / ".drained.json.tmp"
        tmp.write_text('{"1": {}}')
        os.replace(tmp, f)  # how statedir.write_json replaces a file
        assert watch.changed() and _quiet(watch)
        with open(f, "r+") as fh:  # an editor that writes in place: same inode, no rename
            fh.write('{"2"')
        assert watch.changed() and _quiet(watch)
        os.chmod(f, 0o600)
        assert watch.changed() and _quiet(watch)
        f.unlink()
        assert watch.changed() and _quiet(watch)
        (tmp_path / "sub").mkdir()
        assert watch.changed() and _quiet(watch)
        (tmp_path / "sub" / "inner").write_text("x")  # not recursive: a subdirectory's files are not the state files
        assert _quiet(watch)
    finally:
        watch.close()


def test_the_backstop_answers_changed_even_without_an_event(tmp_path):
    clock = Clock()
    watch = DirWatch([tmp_path], backstop_s=30.0, clock=clock)
    try:
        assert watch.changed() and _quiet(watch)
        clock.now += 29.9
        assert _quiet(watch)
        clock.now += 0.2
        assert watch.changed() and _quiet(watch)
    finally:
        watch.close()


def test_a_directory_that_comes_later_and_one_removed_and_made_again_are_still_watched(tmp_path):
    later = tmp_path / "etc" / "gpuwarden"
    state = tmp_path / "state"
    state.mkdir()
    watch = DirWatch([state, later], clock=Clock())
    try:
        assert watch.changed() and _quiet(watch)
        later.mkdir(parents=True)  # seen through its deepest existing ancestor
        assert watch.changed() and _quiet(watch)
        (later / "node.toml").write_text("[arena]\n")
        assert watch.changed() and _quiet(watch)
        os.rename(state, tmp_path / "old-state")
        state.mkdir()
        assert watch.changed()
        watch.changed()
        (state / "baseline.json").write_text("{}")  # the new directory is watched, not the moved-away one
        assert watch.changed() and _quiet(watch)
        (tmp_path / "old-state" / "x").write_text("x")
        assert _quiet(watch)
    finally:
        watch.close()


def test_without_inotify_every_ask_is_changed_and_the_reason_is_kept(tmp_path):
    # A real failure: no descriptor left for inotify_init1 (EMFILE) in a child with a tiny descriptor limit.
    code = (
        "import os, resource, sys\n"
        "from gpuwarden.ops.foundation.dirwatch import DirWatch\n"
        "import inotify_simple\n"
        "n = max(int(fd) for fd in os.listdir('/proc/self/fd')) + 1\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))\n"
        "try:\n"
        "    while True:\n"
        "        os.open('/dev/null', os.O_RDONLY)\n"  # fill every slot left below the limit
        "except OSError:\n"
        "    pass\n"
        "w = DirWatch([sys.argv[1]])\n"
        "print(w.changed(), w.changed(), w.changed(), w.unavailable)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True True True inotify unavailable:"), out.stdout
    assert "checked every refresh instead" in out.stdout


def _sampler(state_dir: Path, config: Path) -> tuple[Sampler, SimNode]:
    node = SimNode(state_dir)
    node.init(gpus=2, vram=1 << 30)
    settings = Settings(state_dir=state_dir, config_path=config)
    return Sampler(settings, SysfsBackend(sysfs_root=node.sysfs_root, dev_root=node.dev_root), deep_every_s=1e9), node


def test_a_living_sampler_reads_state_files_only_after_a_change_and_sees_each_at_the_next_refresh(
        state_dir, tmp_path, monkeypatch):
    config = tmp_path / "etc" / "node.toml"
    sampler, _ = _sampler(state_dir, config)
    reads = []
    real = extras_mod.nodestate.drained_or_warning

    def counting(*args, **kwargs):
        reads.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(extras_mod.nodestate, "drained_or_warning", counting)
    try:
        sampler.snapshot(deep=True)
        sampler.snapshot()  # the second refresh arms the watch and reads once more
        before = len(reads)
        for _ in range(5):
            assert sampler.snapshot().drained == ()
        assert len(reads) == before  # quiet: not one state file asked
        assert sampler.extras.sample() is sampler.extras.sample()  # no engines, no arena: the same extras again
        nodestate.set_drained(state_dir, 1, True, who="test", reason="watch")
        assert sampler.snapshot().drained == (1,)
        assert sampler.snapshot().drained == (1,) and len(reads) == before + 1
        # A config edited in place with a typo, in a directory that did not exist at the start.
        config.parent.mkdir()
        config.write_text("[arena\n")
        warned = sampler.snapshot().warnings
        assert any(w.code == "config-unusable" for w in warned), warned
        config.write_text("")
        assert not any(w.code == "config-unusable" for w in sampler.snapshot().warnings)
        (state_dir / "engines").mkdir()  # the first launch makes it: from the next refresh engines are listed
        sampler.snapshot()
        assert sampler.extras._engine_watch is not None and sampler.extras._plain is None
    finally:
        sampler.close()


def test_a_one_shot_sampler_makes_no_watch(state_dir, tmp_path):
    sampler, _ = _sampler(state_dir, tmp_path / "node.toml")
    try:
        sampler.snapshot(deep=True)
        assert sampler.extras._watch is None
        sampler.snapshot()
        assert sampler.extras._watch is not None
    finally:
        sampler.close()
    assert sampler.extras._watch is None


def test_a_sampler_without_inotify_still_sees_every_change(state_dir, tmp_path, monkeypatch):
    import inotify_simple

    def refused(*args, **kwargs):
        raise OSError(24, "Too many open files")
    monkeypatch.setattr(inotify_simple, "INotify", refused)  # the limit reached, as the child above shows for real
    sampler, _ = _sampler(state_dir, tmp_path / "node.toml")
    try:
        sampler.snapshot(deep=True)
        sampler.snapshot()
        assert sampler.extras._watch is not None and sampler.extras._watch.unavailable
        nodestate.set_drained(state_dir, 0, True, who="test", reason="no inotify")
        assert sampler.snapshot().drained == (0,)
    finally:
        sampler.close()
