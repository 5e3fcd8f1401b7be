"""Build and run the libFuzzer target for the C state reader for a bounded time.

    python -m fakenvml.native.fuzz --seconds 60

The corpus is seeded with real state files written by the control plane, so the fuzzer
starts from valid input (CRC and all) and mutates from there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from fakenvml import statefile
from fakenvml.model import Gpu, Link, Node
from fakenvml.native import build, header

HARNESS = Path(__file__).resolve().parent.parent / "fuzz" / "state_fuzzer.c"


def seeds() -> dict[str, bytes]:
    def gpu(i: int, links: int) -> Gpu:
        return Gpu(
            index=i, uuid=f"GPU-{i:08x}-0000-4000-8000-000000000000", name="NVIDIA H100",
            serial=f"{i:013d}", pci_domain=0x100, pci_bus=i + 1, pci_device=0,
            pci_device_id=0x233010DE, pci_subsystem_id=0, memory_total=80 << 30, cc_major=9,
            cc_minor=0, arch=9, links=[Link(0, (i + 1) % 2, "00000100:01:00.0")] * links,
        )  # fmt: skip

    return {
        "one-gpu": statefile.pack(Node("n", [gpu(0, 0)]), 1),
        "two-gpus-nvlink": statefile.pack(Node("n", [gpu(0, 18), gpu(1, 18)]), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path("build"))
    args = ap.parse_args()
    work = args.out / "fuzz"
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for name, data in seeds().items():
        (corpus / name).write_bytes(data)
    binary = work / "state_fuzzer"
    srcs = [str(p) for p in build.sources()]
    subprocess.run(
        ["clang-14", *build.CFLAGS, "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=all", "-DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION",
         f"-I{header.path().parent}", f"-I{build.SRC}",
         "-o", str(binary), str(HARNESS), *srcs],
        check=True,
    )  # fmt: skip
    print(f"fakenvml: fuzzing the state reader for {args.seconds}s")
    res = subprocess.run(
        [str(binary), f"-max_total_time={args.seconds}", "-print_final_stats=1",
         f"-artifact_prefix={work}/", str(corpus)],
        capture_output=True, text=True,
    )  # fmt: skip
    stats = [ln for ln in res.stderr.splitlines() if ln.startswith(("stat::", "Done", "=="))]
    print("\n".join(stats[-6:]))
    if res.returncode != 0:
        sys.stderr.write(res.stderr[-4000:])
        raise SystemExit(f"fuzz: crash found, reproducer under {work}/")
    print("fakenvml: fuzz clean")


if __name__ == "__main__":
    main()
