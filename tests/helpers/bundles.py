"""A real incident bundle of a two-GPU sim node, collected once a test module, for the tests that damage it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory) -> bytes:
    """The bytes of a bundle `collect_bundle` made (safe mode, 5 s per collector)."""
    from gpuwarden.ops.bundle.collect import collect_bundle
    from gpuwarden.ops.foundation.settings import Settings
    from gpuwarden.ops.node.sim.node import SimNode
    state = tmp_path_factory.mktemp("bundle-state")
    SimNode(state).init(gpus=2, vram=4 << 30)
    result = collect_bundle(Settings(state_dir=state, config_path=state / "none.toml", backend="sim"),
                            output=tmp_path_factory.mktemp("bundle-out"), safe_mode=True, timeout_s=5)
    return result.path.read_bytes()
