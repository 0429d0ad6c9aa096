"""What several test files share with test_metrics_e2e.py: Prom.

Taken out of test_metrics_e2e.py so that no test module imports another (tests/README.md)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.parse
import urllib.request
from helpers.net import free_port
from helpers.simnode import wait_for
from helpers.metrics_rules import RULES


class Prom:
    """A real Prometheus scraping `target` (an address), or several targets each under its own instance label
    ({instance: address}, as a site names its nodes), every second unless told."""

    def __init__(self, tmp_path, target: str | dict[str, str], scrape_interval: str = "1s"):
        rules = tmp_path / "rules.yml"
        rules.write_text(re.sub(r"(?m)^(\s+for: )\S+$", r"\g<1>2s", RULES.read_text()))
        config = tmp_path / "prometheus.yml"
        if isinstance(target, str):
            static = f"    static_configs: [{{targets: ['{target}']}}]\n"
        else:
            static = "    static_configs:\n" + "".join(f"      - {{targets: ['{address}'], labels: {{instance: '{name}'}}}}\n"
                                                    for name, address in target.items())
        config.write_text(f"global:\n  scrape_interval: {scrape_interval}\n  evaluation_interval: 1s\n"
                          f"rule_files: [{rules}]\n"
                          "scrape_configs:\n  - job_name: gpuwarden\n" + static)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = tmp_path / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}", "--storage.tsdb.retention.time=1h"],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        wait_for(self._ready, timeout=60, what=f"prometheus ready; log:\n{self.log}", poll=0.2)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def firing(self, alert: str) -> list[dict]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
