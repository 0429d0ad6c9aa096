"""A cap on the connections a threaded socketserver serves at once, shared by the agent's API and the metrics
listener: past the cap, refuse() answers in the accepting thread (cheaply, never blocking) and closes.
"""

from __future__ import annotations

import threading


class ConnectionCap:
    """Mixin placed before socketserver.ThreadingMixIn; call init_cap(max_clients) in __init__."""

    def init_cap(self, max_clients: int) -> None:
        self.max_clients = max_clients
        self.active = 0
        self._count_lock = threading.Lock()

    def refuse(self, request) -> None:
        """Answer a connection over the cap (default: just close it)."""

    def process_request(self, request, client_address) -> None:
        with self._count_lock:
            full = self.active >= self.max_clients
            if not full:
                self.active += 1
        if full:
            self.refuse(request)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.active -= 1
