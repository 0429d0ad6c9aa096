"""The foundations every other part of ops stands on: errors, units, redaction, the state dir,
records, journal, locks and the snapshot's data model. Nothing here reads a GPU.
"""
