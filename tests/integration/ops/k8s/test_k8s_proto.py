"""ops/k8s/proto/generate.sh reproduces the committed gRPC modules and their type stubs from the .proto files.

The modules install as gpuwarden.ops.k8s.proto: protoc names them after their path from the repository root,
and the script must turn that into the installed name (a regenerated module that imports ops.k8s.proto fails
at import), and the .pyi stubs mypy reads must be the ones the .proto files make.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO

PROTO = REPO / "ops" / "k8s" / "proto"
GENERATED = sorted(p.name for p in PROTO.iterdir() if p.name.endswith((".py", ".pyi")) and "_pb2" in p.name)


def test_generate_sh_reproduces_the_committed_modules_and_stubs(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) generates the modules")
    assert len(GENERATED) == 8, GENERATED  # two protos: _pb2 and _pb2_grpc, each .py and .pyi
    copy = tmp_path / "ops" / "k8s" / "proto"
    copy.mkdir(parents=True)
    for p in PROTO.iterdir():
        if p.suffix in (".proto", ".sh"):
            shutil.copy(p, copy / p.name)
    # The interpreter running the tests provides python -m grpc_tools.protoc and mypy-protobuf's plugin.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["sh", str(copy / "generate.sh")], env=env, check=True, capture_output=True, timeout=60)
    for name in GENERATED:
        made = (copy / name).read_text()
        assert made == (PROTO / name).read_text(), f"{name} differs from what generate.sh makes: run it"
        if name.endswith("_grpc.py") or name.endswith("_grpc.pyi"):
            assert "from gpuwarden.ops.k8s.proto import" in made and "from ops." not in made
