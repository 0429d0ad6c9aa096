"""NVIDIA Xid numbers: what each common one means and how bad it is.

Meanings follow NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors); severities are ours.
"""

from __future__ import annotations

# number -> (meaning, severity)
XIDS: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing (channel idle timeout)", "error"),
    13: ("Graphics engine exception (often an application bug: illegal instruction or address)", "error"),
    31: ("GPU memory page fault (MMU fault; usually an application bad access)", "error"),
    32: ("Invalid or corrupted push buffer stream", "error"),
    38: ("Driver firmware error", "error"),
    43: ("GPU stopped processing (reset channel verification error; the app hit a fault)", "error"),
    44: ("Graphics engine fault during context switch", "error"),
    45: ("Preemptive cleanup, due to previous errors", "warning"),
    48: ("Double-bit ECC error (DBE)", "critical"),
    56: ("Display engine error", "error"),
    57: ("Error programming video memory interface", "critical"),
    58: ("Unstable video memory interface detected", "critical"),
    61: ("Internal micro-controller breakpoint/warning", "error"),
    62: ("Internal micro-controller halt", "critical"),
    63: ("ECC page retirement or row remapping recording event (reset the GPU to apply)", "warning"),
    64: ("ECC page retirement or row remapping recording failure", "critical"),
    68: ("Video processor (NVDEC) exception", "error"),
    69: ("Graphics engine class error", "error"),
    74: ("NVLink error", "critical"),
    79: ("GPU has fallen off the bus", "critical"),
    92: ("High single-bit ECC error rate", "warning"),
    94: ("Contained ECC error (the affected application was stopped)", "error"),
    95: ("Uncontained ECC error (reset the GPU; results since may be wrong)", "critical"),
    109: ("Context switch timeout", "error"),
    119: ("GSP RPC timeout", "critical"),
    120: ("GSP error", "critical"),
    121: ("C2C link corrected error", "warning"),
    140: ("Unrecovered ECC error", "critical"),
    143: ("GPU initialization failure", "critical"),
    154: ("GPU recovery action changed (see nvidia-smi for the action needed)", "error"),
}


def describe(number: int) -> tuple[str, str]:
    """(meaning, severity) for an Xid; unknown numbers are errors with a pointer to the catalog."""
    return XIDS.get(number, (f"Xid {number} (see NVIDIA's Xid catalog)", "error"))
