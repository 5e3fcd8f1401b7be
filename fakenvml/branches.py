"""The driver layer of the board model: what a driver branch answers on every board it
drives, whatever the board. The library holds the rules that are argument checks and error
codes (src/*.c: a field id the driver does not know is INVALID_ARGUMENT, a P-state the
board lacks UNKNOWN, link indices past the board's last link INVALID_ARGUMENT, every event
type the driver knows registrable); this module holds what varies with the branch and
reaches the library as data in every GPU's record: the field ids the driver rejects, the
fields every board of it answers, the CUDA version it ships.

Sources: [walk] the H100 capture (tests/fakenvml/data/h100/h100-walk.json, driver
580.159.04); [h] nvml.h of the nvidia-nvml-dev package the build uses (13.5: NVML_FI_*
numbered in the order they were added, up to NVML_FI_MAX 310).

The other layers: fakenvml/families.py (the architecture), fakenvml/profiles.py (the
board), fakenvml/platforms.py (bare metal or a VM).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fakenvml.model import FIELD_UNKNOWN, VALUE_UINT, FieldValue, Gpu

ALL_IDS = 0xFFFFFFFF  # a range's end: every id from its start on


@dataclass(frozen=True)
class Branch:
    major: int  # 580
    cuda: int  # the CUDA version it ships, as nvmlSystemGetCudaDriverVersion (13000)
    # Field ids it rejects with INVALID_ARGUMENT, as (first, last) ranges.
    rejected_fields: tuple[tuple[int, int], ...] = ()
    # Fields every board of it answers (value type, value), whatever the family.
    fields: dict[int, FieldValue] = field(default_factory=dict)
    # What it answers to arguments it refuses, whatever the board, by fakenvml.walk's key.
    refusals: dict[str, str] = field(default_factory=dict)
    # value -> why, for values no source gives.
    unsourced: dict[str, str] = field(default_factory=dict)

    def field_table(self) -> dict[int, FieldValue]:
        """Its part of a GPU's field table: the rejected ranges (an entry per range, its
        value the range's last id) and the fields every board answers."""
        rejected = {first: (FIELD_UNKNOWN, last) for first, last in self.rejected_fields}
        return {**rejected, **self.fields}

    def refuses(self, key: str, gpu: Gpu) -> str | None:
        """The return code its argument checks give a walk key on `gpu`, or None where no
        check applies: a field id it rejects, a P-state the board lacks, a link index past
        the board's links, and the fixed refusals."""
        if key in self.refusals:
            return self.refusals[key]
        field_id = _arg(r"field\[(\d+)\]", key)
        if field_id is not None and any(a <= field_id <= b for a, b in self.rejected_fields):
            return INVALID_ARGUMENT
        pstate = _arg(r"nvmlDeviceGetMinMaxClockOfPState\(0,(\d+)\)", key)
        if pstate is not None and gpu.pstates and pstate not in gpu.pstates:
            return UNKNOWN  # [walk] P1, P5, P8, P12, P15 on a board of P0 and P2
        link = _arg(r"nvmlDeviceGetNvLinkCapability\((\d+),\d+\)", key)
        if link is not None and gpu.nvlink_board and link >= gpu.nvlink_board:
            return INVALID_ARGUMENT  # [walk] links 18 and 19 of an 18-link H100
        return None


def _arg(pattern: str, key: str) -> int | None:
    m = re.fullmatch(pattern, key)
    return int(m.group(1)) if m else None


# What R580 rejects: [walk] field[0], field[274], field[289..293] and field[296..299]
# answer INVALID_ARGUMENT. Ids past 299 are derived: [h] numbers fields in the order they
# were added, so a driver that does not know 296-299 knows none after them.
_R580_REJECTED = ((0, 0), (274, 274), (289, 293), (296, ALL_IDS))
# [walk] field[230] NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 (the library answers it from the
# faults injected since, on every board: docs/fakenvml.md, "Recovery is observable").
_RECOVERY_ACTION = {230: (VALUE_UINT, 0)}

INVALID_ARGUMENT, NOT_SUPPORTED, UNKNOWN = (
    "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_UNKNOWN",
)  # fmt: skip
# [walk]: what R580 answers to arguments it refuses. A full GPU's handle is no MIG device's;
# violation policies past the two totals (6, 7) are none; event types past bit 15 are
# none the driver knows; a GPU alone has no nearest GPUs, and pynvml's second call (a
# zero-entry buffer) is refused.
_R580_REFUSALS = {
    "nvmlDeviceGetComputeInstanceId": INVALID_ARGUMENT,
    "nvmlDeviceGetGpuInstanceId": INVALID_ARGUMENT,
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": INVALID_ARGUMENT,
    **{f"nvmlDeviceGetViolationStatus({p})": INVALID_ARGUMENT for p in (6, 7)},
    **{f"nvmlDeviceRegisterEvents(1<<{b})": NOT_SUPPORTED for b in range(16, 20)},
    **{f"nvmlDeviceGetTopologyNearestGpus({lvl})": INVALID_ARGUMENT
       for lvl in (0, 10, 20, 30, 40, 50)},
}  # fmt: skip

R580 = Branch(major=580, cuda=13000, rejected_fields=_R580_REJECTED, fields=_RECOVERY_ACTION,
              refusals=_R580_REFUSALS)  # fmt: skip

# The CUDA version each branch ships (nvmlSystemGetCudaDriverVersion): NVIDIA's CUDA
# release notes, table "CUDA Toolkit and Corresponding Driver Versions".
_CUDA = {
    525: 12000, 530: 12010, 535: 12020, 545: 12030, 550: 12040, 555: 12050,
    560: 12060, 565: 12070, 570: 12080, 575: 12090,
}  # fmt: skip
_EARLIER = "unsourced: R580's (the only branch captured); earlier drivers know fewer fields"

BRANCHES: dict[int, Branch] = {
    **{
        major: Branch(
            major=major,
            cuda=cuda,
            rejected_fields=_R580_REJECTED,
            fields=_RECOVERY_ACTION,
            unsourced={"rejected_fields": _EARLIER},
        )
        for major, cuda in _CUDA.items()
    },
    580: R580,
}


def of(driver_version: str) -> Branch:
    """The branch of a driver version ("580.95.05" -> R580); a branch this module does not
    know gets R580's rules and no CUDA version (cuda 0)."""
    major = int(driver_version.split(".")[0])
    if major in BRANCHES:
        return BRANCHES[major]
    return Branch(major=major, cuda=0, rejected_fields=_R580_REJECTED, fields=_RECOVERY_ACTION,
                  refusals=_R580_REFUSALS,
                  unsourced={"rejected_fields": _EARLIER, "refusals": _EARLIER,
                             "cuda": "no table entry"})  # fmt: skip
