#!/usr/bin/env bash
# Install gpuwarden with its test extras into ./.venv and run the whole test suite.
# This is the README's test command and exactly what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v tmux >/dev/null 2>&1; then
    # The TUI's end-to-end test drives the real program inside tmux.
    echo "tmux missing: installing it from Debian's packages" >&2
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null;
    else sudo apt-get update -qq && sudo apt-get install -y -qq tmux >/dev/null; fi
fi

# The fleet tests start real OpenSSH servers (Debian's openssh-server; ssh-keygen comes with the client);
# `gpuwarden serve` is tested in Debian's headless Chromium; the metrics tests lint the exposition and
# unit-test the alert rules with promtool and run a real Prometheus against the agent (Debian's prometheus
# package brings both), as does the fleet's --prometheus path.
missing=""
# The install builds the registration interposer (native/) and the preload tests build stand-in runtimes: a C compiler.
{ command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; } || missing="$missing gcc libc6-dev"
# Crashed engines' cores are read by eu-stack, else gdb; the tests take each tool's branch on a real core.
command -v gdb >/dev/null 2>&1 || missing="$missing gdb"
command -v eu-stack >/dev/null 2>&1 || missing="$missing elfutils"
[ -x /usr/sbin/mkfs.ext4 ] || missing="$missing e2fsprogs"  # tests/integration/ops/agent/test_agent_readonly.py: an ext4 that errors to read-only
# Packaging: the compiler-free wheel is installed into a Debian root fs built by mmdebstrap (no gcc there),
# the container image is packed by umoci, the aarch64 interposer runs under qemu-user, and the kustomize
# overlays are rendered by kubectl (>= 1.21 for kustomize's components: the machines' image has one; Debian 12's
# own kubernetes-client is 1.20, whose kustomize 2.0.3 the test names as too old).
command -v mmdebstrap >/dev/null 2>&1 || missing="$missing mmdebstrap"
command -v umoci >/dev/null 2>&1 || missing="$missing umoci"
command -v qemu-aarch64 >/dev/null 2>&1 || missing="$missing qemu-user"
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing="$missing gcc-aarch64-linux-gnu"
command -v kubectl >/dev/null 2>&1 || missing="$missing kubernetes-client"
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
command -v ssh-keygen >/dev/null 2>&1 || missing="$missing openssh-client"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
{ command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; } || missing="$missing prometheus"
if [ -n "$missing" ]; then
    echo "installing from Debian's packages:$missing" >&2
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $missing >/dev/null;
    else sudo apt-get update -qq && sudo apt-get install -y -qq $missing >/dev/null; fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'
# Lint and types first: a finding fails the run before the suite spends its minutes.
.venv/bin/ruff check --quiet .
.venv/bin/python tests/typecheck.py
# The preload tests also run unmodified engines against ROCm 5.4's real HIP runtime (PyPI's pytorch-triton-rocm
# wheel, fetched once into .cache/rocm-5.4; tests/helpers/realhip.py says how and why).
.venv/bin/python tests/helpers/realhip.py fetch
# Both tiers (pyproject's testpaths: tests/unit, then tests/integration); arguments go to pytest, so
# `bash tests/run-all.sh tests/unit` runs the unit tier alone. Each test file whole on one worker (its module and
# session fixtures built once); GPUWARDEN_TEST_JOBS=0 runs everything in this process.
# Two workers a core: most tests wait on the children they start (CLI, agent, sshd, Prometheus, Chromium), and
# with one a core the two cores were busy 53% of the run (632 s of pytest); with two, 425 s (measured 2026-12-02).
jobs=$(( $(nproc) * 2 ))
exec .venv/bin/python -m pytest -n "${GPUWARDEN_TEST_JOBS:-$jobs}" --dist loadfile --durations=25 "$@"
