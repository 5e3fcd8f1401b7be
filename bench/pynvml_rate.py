"""nvidia-ml-py call rates against one library, in a process of its own so that ours and a
peer's are measured alike: `python -m bench.pynvml_rate LIB` prints JSON
{function: calls/s}, cycling over every GPU the library has (not one hot handle)."""

from __future__ import annotations

import ctypes
import itertools
import json
import sys
import time
from collections.abc import Callable


def rate(fn: Callable[[], object], seconds: float = 1.0) -> float:
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        for _ in range(100):
            fn()
        n += 100
    return n / elapsed


def main() -> None:
    # Loaded first under its soname, the library is the one pynvml's own dlopen finds.
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
    import pynvml as nv

    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    rates = {}
    for name, call in (("GetUUID", nv.nvmlDeviceGetUUID),
                       ("GetMemoryInfo", nv.nvmlDeviceGetMemoryInfo)):  # fmt: skip
        cycle = itertools.cycle(handles)
        rates[name] = rate(lambda call=call, cycle=cycle: call(next(cycle)))
    nv.nvmlShutdown()
    print(json.dumps({"gpus": len(handles), "rates": rates}))


if __name__ == "__main__":
    main()
