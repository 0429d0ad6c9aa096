"""NVIDIA Xid numbers: what each common one means, how bad it is, whether the hardware is suspect.

Meanings follow NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors); severities and the
hardware/application split are ours (hardware Xids are ordered before the application Xids they cause).
"""

from __future__ import annotations

# number -> (meaning, severity, hardware?)
XIDS: dict[int, tuple[str, str, bool]] = {
    8: ("GPU stopped processing (channel idle timeout)", "error", False),
    13: ("Graphics engine exception (often an application bug: illegal instruction or address)", "error", False),
    31: ("GPU memory page fault (MMU fault; usually an application bad access)", "error", False),
    32: ("Invalid or corrupted push buffer stream (DMA / PCIe quality)", "error", True),
    38: ("Driver firmware error", "error", True),
    43: ("GPU stopped processing (reset channel verification error; the app hit a fault)", "error", False),
    44: ("Graphics engine fault during context switch", "error", False),
    45: ("Preemptive cleanup, due to previous errors: the process's GPU channels were torn down", "error", False),
    48: ("Double-bit ECC error (DBE)", "critical", True),
    56: ("Display engine error", "error", False),
    57: ("Error programming video memory interface", "critical", True),
    58: ("Unstable video memory interface detected", "critical", True),
    61: ("Internal micro-controller breakpoint/warning", "error", True),
    62: ("Internal micro-controller halt", "critical", True),
    63: ("ECC page retirement or row remapping recording event (reset the GPU to apply)", "warning", True),
    64: ("ECC page retirement or row remapping recording failure", "critical", True),
    68: ("Video processor (NVDEC) exception", "error", False),
    69: ("Graphics engine class error", "error", False),
    74: ("NVLink error", "critical", True),
    79: ("GPU has fallen off the bus", "critical", True),
    92: ("High single-bit ECC error rate", "warning", True),
    94: ("Contained ECC error (the affected application was stopped)", "error", True),
    95: ("Uncontained ECC error (reset the GPU; results since may be wrong)", "critical", True),
    109: ("Context switch timeout", "error", False),
    119: ("GSP RPC timeout (the GPU's firmware processor stopped answering)", "critical", True),
    120: ("GSP error", "critical", True),
    121: ("C2C link corrected error", "warning", True),
    137: ("NVLink/PRI interrupt error", "error", True),
    140: ("Unrecovered ECC error", "critical", True),
    143: ("GPU initialization failure", "critical", True),
    144: ("NVLink SAW error", "critical", True),
    145: ("NVLink RLW error", "critical", True),
    146: ("NVLink TLW error", "critical", True),
    147: ("NVLink TREX error", "critical", True),
    148: ("NVLink NVLPW error", "critical", True),
    149: ("NVLink NETIR error", "critical", True),
    150: ("NVLink MSE error", "critical", True),
    154: ("GPU recovery action changed (see nvidia-smi for the action needed)", "error", True),
    171: ("Uncorrectable ECC error in DRAM", "critical", True),
    172: ("Uncorrectable ECC error in SRAM", "critical", True),
}

CHECK_HARDWARE = ("`nvidia-smi -q` for this GPU (ECC, remapped rows, recovery action), then drain and reset it; "
                  "repeated on one GPU = a board for RMA")
CHECK_APPLICATION = ("the process named: its own log (CUDA error) at that moment; Xids that follow it on the same "
                     "GPU with no hardware Xid before them point at the application, not the GPU")


def describe(number: int) -> tuple[str, str]:
    """(meaning, severity) for an Xid; unknown numbers are errors with a pointer to the catalog."""
    meaning, severity, _ = XIDS.get(number, (f"Xid {number} (see NVIDIA's Xid catalog)", "error", True))
    return meaning, severity


def is_hardware(number: int) -> bool:
    return XIDS.get(number, ("", "", True))[2]


def adjusted_severity(number: int, message: str) -> str:
    """NVLink Xids say themselves whether they were fatal."""
    _, severity = describe(number)
    if 144 <= number <= 150 and "Nonfatal" in message:
        return "warning"
    return severity
