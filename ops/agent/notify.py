"""sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET (READY=1, STOPPING=1, STATUS=...).

A leading "@" names an abstract socket. Without NOTIFY_SOCKET (not under systemd) nothing is sent.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send `message` (e.g. "READY=1\\nSTATUS=sampling 4 GPUs"); True when a datagram went out."""
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), address)
        return True
    except OSError:
        return False  # systemd gone or the socket unreachable: the agent runs on regardless