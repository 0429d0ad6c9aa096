"""Incident bundles: concurrent collectors with timeouts, redaction, size caps, one atomic .tar.gz.

collect.collect_bundle() makes one; replay.snapshot_from_bundle() reads one back; auto.maybe_collect()
is what the engine shim calls when an engine dies of a signal.
"""
