"""One SSH connection to one node with the operator's ~/.ssh/config, keys and known_hosts (asyncssh).

An unknown host key is refused with the exact known_hosts line to add (or added with accept_new, as
OpenSSH's StrictHostKeyChecking=accept-new does); a changed host key is always refused.
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.ops.foundation import extras
from gpuwarden.ops.foundation.errors import GpuwardenError
from gpuwarden.ops.fleet.inventory import Host, parse_target

if TYPE_CHECKING:
    import asyncssh

DEFAULT_PORT = 22


@dataclass(frozen=True)
class SshSettings:
    """How to reach nodes: ssh config files (empty: ~/.ssh/config as ssh does), host key policy, timeouts."""

    config_files: tuple[Path, ...] = ()
    accept_new: bool = False
    connect_timeout: float = 10.0


class Unreachable(GpuwardenError):
    """The node could not be reached or logged into; the message is the reason in one clause."""


class HostKeyRefused(Unreachable):
    """The node's host key is unknown or changed: nothing was sent to it."""


def known_hosts_name(host: str, port: int) -> str:
    """How OpenSSH names a host in known_hosts: `host`, or `[host]:port` off port 22."""
    return host if port == DEFAULT_PORT else f"[{host}]:{port}"


def key_line(name: str, key: asyncssh.SSHKey) -> str:
    """The known_hosts line for `key` (an asyncssh public key) under `name`, without a comment."""
    algo, blob = key.export_public_key("openssh").decode().split()[:2]
    return f"{name} {algo} {blob}"


class _Policy:
    """Host key decisions for one connection: remembers what the server offered so a refusal can say it."""

    def __init__(self, files: list[str], accept_new: bool):
        self.files = files
        self.accept_new = accept_new
        self.offered: asyncssh.SSHKey | None = None
        self.known = False  # the host has some key in known_hosts (so a mismatch is a change)
        self.added: str | None = None

    def client(self) -> asyncssh.SSHClient:
        # deferred: optional extra [fleet]; asyncssh (and cryptography) load only when a node is reached over ssh
        import asyncssh

        policy = self

        class Client(asyncssh.SSHClient):
            def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
                # asyncssh calls this only for a key that is not trusted by known_hosts.
                policy.offered = key
                policy.known = policy._has_entry(host, addr, port)
                if policy.accept_new and not policy.known:
                    policy.added = policy._append(known_hosts_name(host, port), key)
                    return True
                return False

        return Client()

    def _has_entry(self, host: str, addr: str, port: int) -> bool:
        # deferred: optional extra [fleet]; asyncssh (and cryptography) load only when a node is reached over ssh
        import asyncssh
        for path in self.files:
            try:
                found = asyncssh.match_known_hosts(path, host, addr, port if port != DEFAULT_PORT else None)
            except (OSError, ValueError):
                continue
            if found[0] or found[1]:
                return True
        return False

    def _append(self, name: str, key: asyncssh.SSHKey) -> str:
        line = key_line(name, key)
        path = Path(self.files[0])
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())  # one write: parallel connections never interleave
        finally:
            os.close(fd)
        return line


def _options(host: Host, ssh: SshSettings, **extra: Any) -> asyncssh.SSHClientConnectionOptions:
    # deferred: optional extra [fleet]; asyncssh (and cryptography) load only when a node is reached over ssh
    import asyncssh
    config = [str(p) for p in ssh.config_files] if ssh.config_files else ()
    kwargs: dict[str, Any] = {"config": config, "host": host.address or host.name,
                              "connect_timeout": ssh.connect_timeout, "login_timeout": ssh.connect_timeout, **extra}
    if host.port:
        kwargs["port"] = host.port
    if host.user:
        kwargs["username"] = host.user
    try:
        return asyncssh.SSHClientConnectionOptions(**kwargs)
    except (OSError, ValueError, asyncssh.Error) as exc:  # a bad ssh config line or an unreadable key
        raise Unreachable(f"ssh settings for {host.name} do not load: {exc}",
                          "check ~/.ssh/config (or --ssh-config) and the IdentityFile it names") from None
    except RecursionError:  # ~/.ssh/config (not checked as --ssh-config is) includes itself
        raise Unreachable(f"ssh settings for {host.name} do not load: the ssh config includes itself (an Include "
                          "loop)", "remove the Include that loops back in ~/.ssh/config") from None


def _known_files(options: asyncssh.SSHClientConnectionOptions) -> list[str]:
    files = options.known_hosts
    if files is None:
        return []
    if not files:  # nothing configured: ssh's default user file
        return [str(Path("~/.ssh/known_hosts").expanduser())]
    # Options built without a known_hosts argument carry the ssh config's known hosts files as a list of names.
    names = files if isinstance(files, (list, tuple)) else ()
    return [str(Path(f).expanduser()) for f in names if isinstance(f, (str, Path))]


MAX_HOPS = 8  # a ProxyJump that names itself (Host * ProxyJump bastion) must not recurse for ever


async def connect(host: Host, ssh: SshSettings, via: asyncssh.SSHClientConnection | None = None,
                  hops: int = 0) -> asyncssh.SSHClientConnection:
    """An open asyncssh connection to `host` (through the connection `via`, or the ProxyJump hosts its ssh
    config names, each checked the same way); Unreachable (with the reason) when that cannot be."""
    extras.need("fleet", "the fleet's SSH")
    policy = _Policy([], ssh.accept_new)
    options = _options(host, ssh, client_factory=policy.client)
    jump = options.tunnel if via is None else None
    opened = None  # the last jump connection opened here (closing it closes the ones before it)
    try:
        if isinstance(jump, str) and jump.lower() != "none":
            via = opened = await _hops(host, ssh, jump, hops)
        return await _open(host, ssh, options, policy, via)
    except BaseException:
        if opened is not None:
            opened.close()
        raise


async def _hops(host: Host, ssh: SshSettings, jump: str, hops: int) -> asyncssh.SSHClientConnection:
    """Open the ProxyJump chain hop by hop ourselves: asyncssh would open jump hosts without this config and
    host key policy. Returns the last hop's connection (closing it closes the chain)."""
    if hops >= MAX_HOPS:
        raise Unreachable(f"{host.name}: more than {MAX_HOPS} ProxyJump hops (does a jump host name itself?)",
                          "exclude the jump host from its own ProxyJump, e.g. `Host * !bastion`")
    via: asyncssh.SSHClientConnection | None = None
    try:
        for hop in jump.split(","):
            try:
                hop_host = parse_target(hop.strip())
            except ValueError:
                raise Unreachable(f"{host.name}: ProxyJump {jump!r} is not [user@]host[:port]",
                                  "fix ProxyJump in the ssh config") from None
            try:
                via = await connect(hop_host, ssh, via, hops + 1)
            except Unreachable as exc:
                said = exc.message if exc.message.startswith("jump host ") else \
                    f"jump host {hop_host.name}: {exc.message}"  # once, however deep the chain failed
                raise Unreachable(said, exc.hint) from None
    except BaseException:
        if via is not None:
            via.close()
        raise
    assert via is not None  # split() yields at least one hop, and each either connected or raised
    return via


async def _open(host: Host, ssh: SshSettings, options: asyncssh.SSHClientConnectionOptions, policy: _Policy,
                via: asyncssh.SSHClientConnection | None) -> asyncssh.SSHClientConnection:
    # deferred: optional extra [fleet]; asyncssh (and cryptography) load only when a node is reached over ssh
    import asyncssh
    extra: dict[str, Any] = {"tunnel": via} if via is not None else {}
    files = policy.files = _known_files(options)
    if not files:
        raise HostKeyRefused(f"{host.name}: host key checking is switched off for it (UserKnownHostsFile none)",
                             "gpuwarden never connects without checking the host key: name a known_hosts file")
    where = known_hosts_name(options.host, options.port)
    existing = [f for f in files if os.path.exists(f)]
    # An empty (but present) list of known hosts: asyncssh would read its default file for an empty argument.
    trusted = existing or asyncssh.import_known_hosts("")
    try:
        # The host again: connect() re-reads the options with its own host argument, '' when left out.
        conn = await asyncssh.connect(host.address or host.name, options=options, config=None,
                                      known_hosts=trusted, **extra)
        if via is not None:
            conn.set_tunnel(via)  # closing the node's connection closes the hops behind it
        return conn
    except asyncssh.HostKeyNotVerifiable:
        raise _refusal(host, where, policy, files[0]) from None
    except asyncssh.PermissionDenied:
        raise Unreachable(f"login as {options.username!r} refused: no key was accepted",
                          "check IdentityFile in ~/.ssh/config, ssh-agent, and the node's authorized_keys") from None
    except asyncssh.DisconnectError as exc:
        raise Unreachable(f"the server closed the connection: {exc.reason}") from None
    except ConnectionRefusedError:
        raise Unreachable(f"connection refused on {where} (no sshd listening)") from None
    except socket.gaierror as exc:
        raise Unreachable(f"cannot resolve {options.host}: {exc.strerror}",
                          "check the name, or its HostName in ~/.ssh/config") from None
    except (asyncio.TimeoutError, TimeoutError):
        raise Unreachable(f"no SSH answer from {where} within {ssh.connect_timeout:g}s") from None
    except OSError as exc:
        raise Unreachable(f"cannot connect to {where}: {exc.strerror or exc}") from None
    except asyncssh.Error as exc:
        raise Unreachable(f"SSH failed: {exc}") from None


def _refusal(host: Host, where: str, policy: _Policy, known_file: str) -> HostKeyRefused:
    key = policy.offered
    if key is None:  # e.g. only a key type that is not in known_hosts for a known host
        return HostKeyRefused(f"{host.name}: host key not verifiable for {where}",
                              f"compare the node's host keys with {known_file}")
    fingerprint = key.get_fingerprint("sha256")
    if policy.known:
        return HostKeyRefused(
            f"{host.name}: HOST KEY CHANGED for {where} (now {fingerprint}): refused, possible man-in-the-middle",
            f"if the node was reinstalled, check that fingerprint on its console, then "
            f"`ssh-keygen -R '{where}' -f {known_file}` and connect again")
    return HostKeyRefused(
        f"{host.name}: host key of {where} is not in {known_file}: refused (fingerprint {fingerprint})",
        f"check the fingerprint on the node, then add this line to {known_file}:  {key_line(where, key)}  "
        f"(or pass --accept-new)")
