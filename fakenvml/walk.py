"""Ask NVML everything a read-only client can ask, through nvidia-ml-py, and record each
answer as {"rc": "SUCCESS" | NVML error name, "value": JSON form of the answer}.

    python -m fakenvml.walk OUT.json [--device N]

The same walk runs on a real GPU and on fakenvml, so two records diff call by call
(tests/fakenvml/test_fidelity.py holds the fake to tests/fakenvml/data/h100/h100-walk.json).
Keys name the call and its arguments, e.g. `nvmlDeviceGetClock(3,1)` or `field[230]`; the
JSON form of a value follows the capture's: structures become objects of their fields,
arrays lists of at most 64 items, bytes text.
"""

from __future__ import annotations

import argparse
import ctypes
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml as nv

Answer = dict[str, Any]
MAX_ITEMS = 64  # the capture keeps the first 64 items of any list
MAX_DEPTH = 4

# NVML return code -> its name in pynvml (the first name pynvml defines for it).
_ERROR_NAMES: dict[int, str] = {}
for _name, _code in vars(nv).items():
    if _name.startswith("NVML_ERROR_") and isinstance(_code, int):
        _ERROR_NAMES.setdefault(_code, _name)


def error_name(code: int) -> str:
    return _ERROR_NAMES.get(code, f"NVML_ERROR_{code}")


def to_json(value: object, depth: int = 0) -> object:
    """The JSON form of a pynvml answer."""
    if depth > MAX_DEPTH:
        return repr(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple | ctypes.Array):
        return [to_json(item, depth + 1) for item in value][:MAX_ITEMS]
    if isinstance(value, ctypes.Structure | ctypes.Union) or hasattr(value, "_fields_"):
        out: dict[str, object] = {}
        for field in getattr(value, "_fields_", []):
            try:
                out[field[0]] = to_json(getattr(value, field[0]), depth + 1)
            except Exception as e:  # a field pynvml cannot convert is itself an answer
                out[field[0]] = f"<{type(e).__name__}>"
        return out
    if isinstance(value, dict):
        return {str(k): to_json(v, depth + 1) for k, v in value.items()}
    if hasattr(value, "__dict__"):
        return {k: to_json(v, depth + 1) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def ask(fn: Callable[..., object], *args: object) -> Answer:
    """One call: its return code and, on success, the JSON form of what it returned."""
    try:
        value = fn(*args)
    except nv.NVMLError as e:
        return {"rc": error_name(e.value)}
    except Exception as e:  # the bindings themselves failed: record how, keep walking
        return {"rc": f"PYTHON:{type(e).__name__}:{str(e)[:120]}"}
    return {"rc": "SUCCESS", "value": to_json(value)}


def _required_params(fn: Callable[..., object]) -> int | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(1 for p in params if p.default is inspect.Parameter.empty)


def _bindings(prefix: str, nparams: int) -> Iterator[tuple[str, Callable[..., object]]]:
    """pynvml functions named prefix* that take exactly `nparams` required arguments."""
    for name in sorted(dir(nv)):
        fn = getattr(nv, name)
        if name.startswith(prefix) and callable(fn) and _required_params(fn) == nparams:
            yield name, fn


def _field(handle: object, field_id: int) -> Answer:
    """One field value per call, so each id keeps its own answer."""
    try:
        (v,) = nv.nvmlDeviceGetFieldValues(handle, [field_id])
    except nv.NVMLError as e:
        return {"rc": f"CALL:{e.value}"}
    except Exception as e:
        return {"rc": f"PYTHON:{type(e).__name__}"}
    if v.nvmlReturn != nv.NVML_SUCCESS:
        return {"rc": _ERROR_NAMES.get(v.nvmlReturn, str(v.nvmlReturn))}
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    name = member.get(v.valueType)
    return {
        "rc": "SUCCESS",
        "value": {"type": v.valueType, "v": getattr(v.value, name) if name else None},
    }


def _placements(handle: object, profile_id: int) -> Answer:
    slots = (nv.c_nvmlGpuInstancePlacement_t * 16)()
    count = ctypes.c_uint(len(slots))
    try:
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, profile_id, slots, ctypes.byref(count)
        )
    except Exception as e:
        return {"rc": str(e)[:80]}
    return {"rc": "SUCCESS", "value": [[p.start, p.size] for p in slots[: count.value]]}


def _clocks(rec: dict[str, Answer], h: object) -> None:
    per_type = [
        "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetApplicationsClock",
        "nvmlDeviceGetDefaultApplicationsClock", "nvmlDeviceGetMaxCustomerBoostClock",
    ]  # fmt: skip
    for clock in range(4):  # graphics, SM, memory, video
        for name in per_type:
            rec[f"{name}({clock})"] = ask(getattr(nv, name), h, clock)
        for clock_id in range(3):  # current, application target, application default
            rec[f"nvmlDeviceGetClock({clock},{clock_id})"] = ask(
                nv.nvmlDeviceGetClock, h, clock, clock_id
            )
    for pstate in (0, 1, 2, 5, 8, 12, 15):
        rec[f"nvmlDeviceGetMinMaxClockOfPState(0,{pstate})"] = ask(
            nv.nvmlDeviceGetMinMaxClockOfPState, h, 0, pstate
        )
    memory = ask(nv.nvmlDeviceGetSupportedMemoryClocks, h)
    if memory["rc"] == "SUCCESS" and memory["value"]:
        rec["nvmlDeviceGetSupportedGraphicsClocks(maxmem)"] = ask(
            nv.nvmlDeviceGetSupportedGraphicsClocks, h, memory["value"][0]
        )


def _links(rec: dict[str, Answer], h: object) -> None:
    for link in range(20):
        for name in ("State", "Version", "RemotePciInfo"):
            fn = getattr(nv, f"nvmlDeviceGetNvLink{name}")
            rec[f"nvmlDeviceGetNvLink{name}({link})"] = ask(fn, h, link)
        for cap in range(6):
            rec[f"nvmlDeviceGetNvLinkCapability({link},{cap})"] = ask(
                nv.nvmlDeviceGetNvLinkCapability, h, link, cap
            )


def _ecc(rec: dict[str, Answer], h: object) -> None:
    for error_type in range(2):  # corrected, uncorrected
        for counter in range(2):  # volatile, aggregate
            rec[f"nvmlDeviceGetTotalEccErrors({error_type},{counter})"] = ask(
                nv.nvmlDeviceGetTotalEccErrors, h, error_type, counter
            )
            for location in range(8):
                rec[f"nvmlDeviceGetMemoryErrorCounter({error_type},{counter},{location})"] = ask(
                    nv.nvmlDeviceGetMemoryErrorCounter, h, error_type, counter, location
                )
    for cause in range(2):
        rec[f"nvmlDeviceGetRetiredPages({cause})"] = ask(nv.nvmlDeviceGetRetiredPages, h, cause)


def _placement_in_system(rec: dict[str, Answer], h: object, other: object) -> None:
    rec["nvmlDeviceGetCpuAffinity(64)"] = ask(nv.nvmlDeviceGetCpuAffinity, h, 64)
    for scope in range(2):  # NUMA node, socket
        rec[f"nvmlDeviceGetCpuAffinityWithinScope(64,{scope})"] = ask(
            nv.nvmlDeviceGetCpuAffinityWithinScope, h, 64, scope
        )
        rec[f"nvmlDeviceGetMemoryAffinity(64,{scope})"] = ask(
            nv.nvmlDeviceGetMemoryAffinity, h, 64, scope
        )
    for level in (0, 10, 20, 30, 40, 50):
        rec[f"nvmlDeviceGetTopologyNearestGpus({level})"] = ask(
            nv.nvmlDeviceGetTopologyNearestGpus, h, level
        )
    rec["nvmlDeviceGetTopologyCommonAncestor(other)"] = ask(
        nv.nvmlDeviceGetTopologyCommonAncestor, h, other
    )
    for index in range(8):
        rec[f"nvmlDeviceGetP2PStatus(other,{index})"] = ask(
            nv.nvmlDeviceGetP2PStatus, h, other, index
        )


def _mig(rec: dict[str, Answer], h: object) -> None:
    for profile in range(16):
        rec[f"nvmlDeviceGetGpuInstanceProfileInfo({profile})"] = ask(
            nv.nvmlDeviceGetGpuInstanceProfileInfo, h, profile
        )
    for profile in range(16):
        info = rec[f"nvmlDeviceGetGpuInstanceProfileInfoV({profile})"] = ask(
            nv.nvmlDeviceGetGpuInstanceProfileInfoV, h, profile, 2
        )
        if info["rc"] != "SUCCESS":
            continue
        pid = info["value"]["id"]
        rec[f"nvmlDeviceGetGpuInstanceRemainingCapacity(id{pid})"] = ask(
            nv.nvmlDeviceGetGpuInstanceRemainingCapacity, h, pid
        )
        rec[f"nvmlDeviceGetGpuInstancePossiblePlacements(id{pid})"] = _placements(h, pid)
    for index in range(2):
        rec[f"nvmlDeviceGetMigDeviceHandleByIndex({index})"] = ask(
            nv.nvmlDeviceGetMigDeviceHandleByIndex, h, index
        )


def _events(rec: dict[str, Answer], h: object) -> Answer:
    supported = ask(nv.nvmlDeviceGetSupportedEventTypes, h)
    rec["eventset"] = ask(nv.nvmlEventSetCreate)
    try:
        es = nv.nvmlEventSetCreate()
    except nv.NVMLError as e:
        rec["eventset-error"] = {"rc": str(e)}
        return supported
    for bit in range(20):  # every type bit, supported or not: registration's own answer
        rec[f"nvmlDeviceRegisterEvents(1<<{bit})"] = ask(
            nv.nvmlDeviceRegisterEvents, h, 1 << bit, es
        )
    rec["nvmlEventSetWait(50ms)"] = ask(nv.nvmlEventSetWait, es, 50)
    nv.nvmlEventSetFree(es)
    return supported


def walk(device: int = 0) -> dict[str, Answer]:
    """Walk NVML for GPU `device` (NVML must not be initialised by the caller)."""
    rec: dict[str, Answer] = {"nvmlInit": ask(nv.nvmlInit)}
    for name, fn in _bindings("nvmlSystemGet", 0):
        rec[name] = ask(fn)
    count = nv.nvmlDeviceGetCount()
    h = nv.nvmlDeviceGetHandleByIndex(device)
    other = nv.nvmlDeviceGetHandleByIndex((device + 1) % count)  # itself on a 1-GPU node
    for name, fn in _bindings("nvmlDeviceGet", 1):
        rec[name] = ask(fn, h)
    _clocks(rec, h)
    rec["nvmlDeviceGetTemperature(GPU)"] = ask(nv.nvmlDeviceGetTemperature, h, 0)
    for threshold in range(8):
        rec[f"nvmlDeviceGetTemperatureThreshold({threshold})"] = ask(
            nv.nvmlDeviceGetTemperatureThreshold, h, threshold
        )
    _links(rec, h)
    _ecc(rec, h)
    _placement_in_system(rec, h, other)
    for counter in range(2):
        rec[f"nvmlDeviceGetPcieThroughput({counter})"] = ask(
            nv.nvmlDeviceGetPcieThroughput, h, counter
        )
    for codec in range(2):
        rec[f"nvmlDeviceGetEncoderCapacity({codec})"] = ask(
            nv.nvmlDeviceGetEncoderCapacity, h, codec
        )
    for policy in range(8):
        rec[f"nvmlDeviceGetViolationStatus({policy})"] = ask(
            nv.nvmlDeviceGetViolationStatus, h, policy
        )
    _mig(rec, h)
    for field_id in range(300):
        rec[f"field[{field_id}]"] = _field(h, field_id)
    rec["_supported_events"] = _events(rec, h)
    rec["_count"] = {"rc": "SUCCESS", "value": count}
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    rec = walk(args.device)
    args.out.write_text(json.dumps(rec, indent=1, sort_keys=True))
    ok = sum(1 for a in rec.values() if a["rc"] == "SUCCESS")
    print(f"{len(rec)} calls, {ok} SUCCESS -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
