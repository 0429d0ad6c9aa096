"""fleet/promapi against a real HTTP server on loopback that answers what a Prometheus-compatible server (or
something that only looks like one) may answer: a reply without its result list is a PrometheusError naming the
server, never a traceback. The happy paths run against a real Prometheus in test_fleet_prometheus.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuwarden.ops.fleet.promapi import PrometheusApi, PrometheusError


def serve(reply: dict[str, object]):
    """An HTTP server on 127.0.0.1 answering every POST with `reply` as JSON; (server, its base URL)."""
    body = json.dumps(reply).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("data", [{"resultType": "vector"}, {"resultType": "vector", "result": None},
                                  {"resultType": "scalar", "result": "1"}])
def test_a_reply_without_a_result_list_is_a_prometheus_error(data):
    server, url = serve({"status": "success", "data": data})
    try:
        with pytest.raises(PrometheusError) as caught:
            PrometheusApi(url, timeout=5).query("up")
        assert caught.value.message.startswith(f"prometheus at {url}: 'up' gave a {data['resultType']} without")
    finally:
        server.shutdown()
        server.server_close()


def test_a_vector_reply_still_reads():
    server, url = serve({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"instance": "gpu01"}, "value": [1700000000.5, "2"]}]}})
    try:
        [sample] = PrometheusApi(url, timeout=5).query("up")
        assert (sample.labels, sample.ts, sample.value) == ({"instance": "gpu01"}, 1700000000.5, 2.0)
    finally:
        server.shutdown()
        server.server_close()
