"""What the driver asks an operator to do after an Xid (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).

Facts from NVIDIA's Xid catalogue: application-level faults (13, 31, 43, 45, 68, 109 — the
Xids NVIDIA's device plugin ignores) need nothing; memory and bus faults need a GPU reset;
a GPU that fell off the bus needs a node reboot. Unknown codes need nothing, so injecting an
arbitrary Xid never invents a recovery demand.
"""

from __future__ import annotations

import enum


class RecoveryAction(enum.IntEnum):  # nvmlDeviceGpuRecoveryAction_t
    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4


# What the driver logs for every uncorrectable (double-bit) ECC error, beside the ECC event:
# "XID 48: This XID indicates an uncorrectable ECC error has occurred" (NVIDIA's GPU Memory
# Error Management note); `inject ecc --double` sends it too (fakenvml/node.py).
DOUBLE_BIT_ECC = 48

RECOVERY: dict[int, RecoveryAction] = {
    48: RecoveryAction.GPU_RESET,  # double-bit ECC error
    63: RecoveryAction.GPU_RESET,  # ECC page retirement / row remapping recorded
    64: RecoveryAction.GPU_RESET,  # ECC page retirement / row remapping failure
    74: RecoveryAction.GPU_RESET,  # NVLink error
    79: RecoveryAction.NODE_REBOOT,  # GPU has fallen off the bus
    92: RecoveryAction.NONE,  # high single-bit ECC rate
    94: RecoveryAction.GPU_RESET,  # contained ECC error
    95: RecoveryAction.GPU_RESET,  # uncontained ECC error
    119: RecoveryAction.GPU_RESET,  # GSP RPC timeout
    120: RecoveryAction.GPU_RESET,  # GSP error
}


def recovery_action(xid: int) -> RecoveryAction:
    return RECOVERY.get(xid, RecoveryAction.NONE)
