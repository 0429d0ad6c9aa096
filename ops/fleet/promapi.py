"""A small client for Prometheus's HTTP API (/api/v1/query, /api/v1/query_range): PromQL in, series out.

Queries go as POST forms (long selectors fit); a failure is one PrometheusError naming the server and the reason.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpuwarden.ops.foundation.errors import GpuwardenError

TOKEN_ENV = "GPUWARDEN_PROMETHEUS_TOKEN"  # a bearer token, for a Prometheus behind an authenticating proxy


class PrometheusError(GpuwardenError):
    """Prometheus did not answer, or answered with an error; the message says which server and why."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    ts: float
    value: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]  # (ts, value), oldest first


class PrometheusApi:
    def __init__(self, url: str, timeout: float = 5.0):
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise GpuwardenError(f"--prometheus {url!r} is not an http(s) URL",
                                 "give the server's base URL, e.g. --prometheus http://prometheus:9090")
        self._auth: str | None = None
        if parts.username is not None:
            # user:password@ in the URL: HTTP basic auth, and the URL shown anywhere loses them.
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self._auth = "Basic " + base64.b64encode(pair.encode()).decode()
        elif os.environ.get(TOKEN_ENV):
            self._auth = "Bearer " + os.environ[TOKEN_ENV].strip()
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        if parts.port:
            netloc += f":{parts.port}"
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.timeout = timeout

    def _post(self, endpoint: str, params: dict[str, str]) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.url}/api/v1/{endpoint}",
                                         data=urllib.parse.urlencode(params).encode(), method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        if self._auth:
            request.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                body = reply.read()
        except urllib.error.HTTPError as exc:
            # Prometheus answers bad PromQL (400/422) and overload (503) with its own error document.
            body = exc.read()
            doc = _json(body)
            reason = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"prometheus at {self.url}: HTTP {exc.code}: {reason or exc.reason}",
                                  _hint(exc.code)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise PrometheusError(f"prometheus at {self.url} did not answer: {reason}",
                                  "check the URL and that Prometheus runs (curl URL/-/ready)") from None
        doc = _json(body)
        data = doc.get("data") if isinstance(doc, dict) and doc.get("status") == "success" else None
        if not isinstance(data, dict):
            reason = doc.get("error") if isinstance(doc, dict) else "not a Prometheus API reply"
            raise PrometheusError(f"prometheus at {self.url}: {reason}", "is this URL a Prometheus server?")
        return data

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query; a scalar result comes back as one sample without labels."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self._post("query", params)
        kind, result = data.get("resultType"), data.get("result")
        if not isinstance(result, list):  # a Prometheus-compatible server that left it out: say so, no traceback
            raise PrometheusError(f"prometheus at {self.url}: {expr!r} gave a {kind} without a result list",
                                  "is this URL a Prometheus server?")
        if kind == "scalar":
            return [Sample({}, float(result[0]), _number(result[1]))]
        if kind != "vector":
            raise PrometheusError(f"prometheus at {self.url}: {expr!r} gave a {kind}, not an instant vector")
        return [Sample(r.get("metric", {}), float(r["value"][0]), _number(r["value"][1])) for r in result]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._post("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                          "step": f"{max(step, 0.001):.3f}"})
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"prometheus at {self.url}: {expr!r} did not give a range vector")
        return [Series(r.get("metric", {}), tuple((float(t), _number(v)) for t, v in r.get("values", [])))
                for r in data.get("result", [])]


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _number(text: str) -> float:
    return float(text)  # Prometheus writes NaN and +Inf as strings Python's float() reads


def _hint(code: int) -> str:
    if code in (400, 422):
        return "check --prometheus-selector (label matchers such as job=\"gpuwarden\")"
    if code in (401, 403):
        return f"give credentials: https://user:password@host/ or a bearer token in ${TOKEN_ENV}"
    return "Prometheus is overloaded or restarting; try again, or leave --prometheus out to read every node over SSH"
