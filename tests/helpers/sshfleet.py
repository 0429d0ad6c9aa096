"""A fleet of real OpenSSH servers on loopback ports, each in front of its own simulated node.

Each sshd has its own host key and config; `SetEnv` gives its sessions their own sim state dir and a
PATH that reaches this checkout's gpuwarden. Works as root (needs /run/sshd) and as a normal user.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.net import free_port


REPO = Path(__file__).resolve().parents[2]  # (conftest imports this module: no import back)
SSHD = "/usr/sbin/sshd"
# Debian's sshd refuses to start as root without its privilege separation directory (compiled in,
# not configurable); as a normal user it runs without privilege separation and needs none.
PRIVSEP_DIR = Path("/run/sshd")




def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair at path / path.pub; returns the public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


def black_hole():
    """A listener that accepts connections and never says a word (a hung sshd, a wedged node).
    Returns (port, close)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue
        for c in held:
            c.close()
        sock.close()
    threading.Thread(target=accept, daemon=True).start()
    return sock.getsockname()[1], stop.set


def answers_ssh(port: int) -> bool:
    """True once something on the port speaks SSH (the server's version line)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.settimeout(2.0)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class SshNode:
    name: str
    port: int
    home: Path
    state_dir: Path
    host_pub: str = ""
    proc: subprocess.Popen | None = None

    @property
    def known_line(self) -> str:
        algo, blob = self.host_pub.split()[:2]
        return f"[127.0.0.1]:{self.port} {algo} {blob}"


@dataclass
class SshFleet:
    """sshd per node plus the client side: a key pair, an ssh config with one Host alias per node, known_hosts."""

    root: Path
    user: str
    nodes: list[SshNode] = field(default_factory=list)
    ssh_config: Path | None = None
    known_hosts: Path | None = None
    client_key: Path | None = None

    def node(self, name: str) -> SshNode:
        return next(n for n in self.nodes if n.name == name)

    def start(self, names: list[str]) -> None:
        if os.geteuid() == 0:
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        self.client_key = self.root / "client_key"
        client_pub = keygen(self.client_key, "gpuwarden-test-client")
        authorized = self.root / "authorized_keys"
        authorized.write_text(client_pub + "\n")
        authorized.chmod(0o600)
        bindir = Path(sys.executable).parent
        for name in names:
            home = self.root / name
            home.mkdir()
            node = SshNode(name, free_port(), home, home / "state")
            node.state_dir.mkdir()
            node.host_pub = keygen(home / "host_key", name)
            path = f"{bindir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
            (home / "sshd_config").write_text("\n".join([
                f"Port {node.port}", "ListenAddress 127.0.0.1", f"HostKey {home / 'host_key'}",
                f"PidFile {home / 'sshd.pid'}", f"AuthorizedKeysFile {authorized}",
                # The test tree lives under a world-writable /tmp; the keys in it are the test's own.
                "StrictModes no", "PubkeyAuthentication yes", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "UsePAM no", "PermitRootLogin prohibit-password",
                # Many parallel logins from one address (the fan-out, the benchmark) are the point here.
                "MaxStartups 200", "MaxSessions 64", "LogLevel ERROR", "Subsystem sftp internal-sftp",
                f"SetEnv GPUWARDEN_STATE_DIR={node.state_dir} GPUWARDEN_BACKEND=sim PATH={path} "
                f"PYTHONPATH={REPO} GPUWARDEN_CONFIG={home / 'node.toml'}",
                "",
            ]))
            self.nodes.append(node)
        for node in self.nodes:
            node.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(node.home / "sshd_config")],
                                         stdout=subprocess.DEVNULL, stderr=open(node.home / "sshd.log", "wb"))
        self.write_client_files()
        deadline = time.monotonic() + 20
        for node in self.nodes:
            while not answers_ssh(node.port):
                if node.proc.poll() is not None:
                    raise AssertionError(f"sshd for {node.name} exited: {(node.home / 'sshd.log').read_text()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"sshd for {node.name} did not answer on port {node.port}")
                time.sleep(0.05)

    def write_client_files(self, extra_config: str = "", changed: tuple[str, ...] = ()) -> None:
        """ssh config with a Host alias per node (plus extra_config) and known_hosts; nodes in `changed` are
        listed with another key, as after a reinstall or under a man in the middle."""
        self.known_hosts = self.root / "known_hosts"
        lines = []
        for n in self.nodes:
            if n.name in changed:
                other = keygen(self.root / f"impostor-{n.name}", "impostor")
                lines.append(f"[127.0.0.1]:{n.port} " + " ".join(other.split()[:2]))
            else:
                lines.append(n.known_line)
        self.known_hosts.write_text("".join(line + "\n" for line in lines))
        self.ssh_config = self.root / "ssh_config"
        blocks = [f"Host {n.name}\n  HostName 127.0.0.1\n  Port {n.port}\n" for n in self.nodes]
        self.ssh_config.write_text("".join(blocks) + extra_config + (
            f"Host *\n  User {self.user}\n  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
            "  BatchMode yes\n"))

    def hosts_file(self, names: list[str] | None = None) -> Path:
        path = self.root / "hosts"
        path.write_text("# test fleet\n" + "".join(f"{n}\n" for n in (names or [x.name for x in self.nodes])))
        return path

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node.proc:
                try:
                    node.proc.wait(5)
                except subprocess.TimeoutExpired:
                    node.proc.kill()


# One engine that serves, then dies by SIGSEGV: a crashed engine recorded by a real shim.
CRASHING_ENGINE = """
[stagger]
slots = 1
registration_timeout = 30

[defaults]
progress = "log"
registered_pattern = "registered"
ready_pattern = "serving"
restart = "no"

[[engines]]
name = "dp0"
gpu = 0
argv = ["/bin/sh", "-c", "echo registered; echo serving; sleep 0.3; kill -SEGV $$"]
"""


def node_cli(node: SshNode, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run gpuwarden against a node's state dir locally (setting up what the node shows)."""
    proc = subprocess.run([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(node.state_dir),
                           "--backend", "sim", *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPUWARDEN_CONFIG": str(node.home / "node.toml")})
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} on {node.name}: {proc.stdout}{proc.stderr}")
    return proc


def init_all(nodes: list[SshNode], *args: str) -> None:
    """`sim init ARGS` on every node at once (one interpreter start each, side by side)."""
    procs = [subprocess.Popen([sys.executable, "-m", "gpuwarden.playbooks.cli.root", "--state-dir", str(n.state_dir), "--backend",
                               "sim", "sim", "init", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for n in nodes]
    for node, proc in zip(nodes, procs):
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"sim init on {node.name}: {err}")


def client_env(fleet: SshFleet) -> dict[str, str]:
    """The operator's side: HOME with the fleet's ssh config as ~/.ssh/config."""
    home = fleet.root / "operator-home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    shutil.copy(fleet.ssh_config, home / ".ssh" / "config")
    return {"HOME": str(home)}


@pytest.fixture(scope="session")
def ssh_fleet(tmp_path_factory):
    """Eight sim nodes behind eight sshd, and gpu09 where nothing listens. gpu02 has residual VRAM (an
    ownerless leak), gpu03 a crashed engine, gpu04's host key changed (known_hosts has another); the rest
    are healthy. Tests that change a node put it back."""
    if not Path(SSHD).exists():
        pytest.fail("sshd not found: install Debian's openssh-server (tests/run-all.sh does)")
    root = tmp_path_factory.mktemp("sshfleet")
    root.chmod(0o755)
    fleet = SshFleet(root, getpass.getuser())
    try:
        fleet.start([f"gpu{i:02d}" for i in range(1, 9)])
        init_all(fleet.nodes, "--gpus", "2", "--vram", "8GiB")
        fleet.write_client_files(f"Host gpu09\n  HostName 127.0.0.1\n  Port {free_port()}\n", changed=("gpu04",))
        node_cli(fleet.node("gpu02"), "sim", "leak", "--gpu", "1", "--size", "3GiB")
        crashed = fleet.node("gpu03")
        (crashed.home / "node.toml").write_text(CRASHING_ENGINE)
        node_cli(crashed, "launch")
        from helpers.simnode import wait_for
        wait_for(lambda: '"crashed"' in node_cli(crashed, "engines", "list", "--json").stdout, timeout=30,
                 what="gpu03's engine to crash")
        yield fleet
    finally:
        fleet.stop()
