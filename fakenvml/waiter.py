"""A reference NVML event consumer: what a device plugin's health loop sees.

Used by the cross-process event tests and the latency benchmark, and handy by hand.

    python -m fakenvml.waiter --gpus 0,1,2,3 --sets 2 --expect 40

Loads the fake library through nvidia-ml-py, opens `--sets` event sets (one thread each),
registers them, prints READY, then prints one JSON line per delivered event until each set
has seen --expect events or waited --idle-ms without one.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from fakenvml import library

library.preload()
import pynvml as nv  # noqa: E402

MASKS = {
    "xid": nv.nvmlEventTypeXidCriticalError,
    "all": nv.nvmlEventTypeXidCriticalError
    | nv.nvmlEventTypeSingleBitEccError
    | nv.nvmlEventTypeDoubleBitEccError,
}
_out = threading.Lock()


def emit(**fields: object) -> None:
    with _out:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def wait_loop(set_id: int, es: object, expect: int, idle_ms: int) -> None:
    seen = 0
    while seen < expect:
        try:
            e = nv.nvmlEventSetWait_v2(es, idle_ms)
        except nv.NVMLError as err:
            if err.value == nv.NVML_ERROR_TIMEOUT:
                break
            emit(set=set_id, error=err.value, t=time.monotonic_ns())
            seen += 1
            continue
        emit(set=set_id, gpu=nv.nvmlDeviceGetIndex(e.device), type=e.eventType,
             data=e.eventData, t=time.monotonic_ns())  # fmt: skip
        seen += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="0")
    ap.add_argument("--sets", type=int, default=1)
    ap.add_argument("--mask", choices=sorted(MASKS), default="all")
    ap.add_argument("--expect", type=int, default=1)
    ap.add_argument("--idle-ms", type=int, default=5000)
    args = ap.parse_args()
    nv.nvmlInit()
    sets = []
    for _ in range(args.sets):
        es = nv.nvmlEventSetCreate()
        for g in args.gpus.split(","):
            nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(int(g)), MASKS[args.mask], es)
        sets.append(es)
    threads = [
        threading.Thread(target=wait_loop, args=(i, es, args.expect, args.idle_ms))
        for i, es in enumerate(sets)
    ]
    emit(ready=True)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for es in sets:
        nv.nvmlEventSetFree(es)
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
