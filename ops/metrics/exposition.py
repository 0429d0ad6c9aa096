"""Formatting families with prometheus_client's encoders (text 0.0.4/1.0.0 or OpenMetrics, as the scraper asks),
reusing a family's text while its samples have not changed, and the WSGI app that serves it (gzip on request).

Most series of a node (holders, phases, crash counters, arena, findings) are the same from one scrape to the
next; formatting only the families that changed keeps a scrape of a large node within a few milliseconds.
"""

from __future__ import annotations

import gc
import gzip
import threading
from typing import TYPE_CHECKING, Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

OM_EOF = b"# EOF\n"


class _One:
    """One family as the collector-like object prometheus_client's encoders take."""

    __slots__ = ("family",)

    def __init__(self, family: Metric):
        self.family = family

    def collect(self) -> list[Metric]:
        return [self.family]


class Exposition:
    """Family texts by (content type, family name), each kept with the samples it was made from."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], tuple[str, list[Sample], bytes]] = {}
        self._lock = threading.Lock()

    def render(self, families: Callable[[], Iterable[Metric]], accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) of the families `families()` builds, for a scraper that sent `accept` (None:
        Prometheus' text format). One scrape at a time, and without the cyclic garbage collector: a full
        collection of the agent's heap would otherwise land in a scrape now and then (most of its p99); it
        runs at the next allocation after the scrape instead."""
        encoder, content_type = choose_encoder(accept or "")
        openmetrics = content_type.startswith("application/openmetrics-text")
        parts: list[bytes] = []
        with self._lock:
            paused = gc.isenabled()
            if paused:
                gc.disable()
            try:
                self._format(families(), encoder, content_type, openmetrics, parts)
            finally:
                if paused:
                    gc.enable()
        if openmetrics:
            parts.append(OM_EOF)
        return b"".join(parts), content_type

    def _format(self, families: Iterable[Metric], encoder: Callable[[Collector], bytes], content_type: str,
                openmetrics: bool, parts: list[bytes]) -> None:
        cache = self._cache
        fresh: dict[tuple[str, str], tuple[str, list[Sample], bytes]] = {}
        for fam in families:
            key = (content_type, fam.name)
            hit = cache.get(key)
            if hit is None or hit[0] != fam.documentation or hit[1] != fam.samples:
                text = encoder(_One(fam))
                if openmetrics and text.endswith(OM_EOF):
                    text = text[:-len(OM_EOF)]
                hit = (fam.documentation, fam.samples, text)
            fresh[key] = hit
            parts.append(hit[2])
        # Of this format, only what this scrape produced is kept: a family that went away is forgotten.
        kept = {k: v for k, v in cache.items() if k[0] != content_type}
        kept.update(fresh)
        self._cache = kept

    def wsgi_app(self, families: Callable[[], Iterable[Metric]]) -> WSGIApplication:
        """A WSGI app serving GET (any path, like prometheus_client's) from `families()`."""

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
            if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
                start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
                return [b"use GET\n"]
            body, content_type = self.render(families, environ.get("HTTP_ACCEPT"))
            headers = [("Content-Type", content_type)]
            if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
                body = gzip.compress(body, compresslevel=1)  # level 1: a tenth of the CPU, most of the gain
                headers.append(("Content-Encoding", "gzip"))
            headers.append(("Content-Length", str(len(body))))
            start_response("200 OK", headers)
            return [body if environ["REQUEST_METHOD"] == "GET" else b""]
        return app
