"""`make bench`: run every benchmark, print one table, write JSON.

Benchmarks measure; they never fail a build. Aims are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import fakenvml_bench, plugin_bench, restart_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/bench.json"))
    ap.add_argument("--no-cluster", action="store_true", help="skip the seed lab's restarts")
    args = ap.parse_args()
    console = Console()
    with console.status("fakenvml benchmarks"):
        rows = fakenvml_bench.run()
    with console.status("device plugin benchmarks (NVIDIA's and ours, node tier)"):
        rows += plugin_bench.run(plugin_bench.all_subjects())
    if not args.no_cluster:
        with console.status("device plugin pod restarts (seed lab)"):
            rows += restart_bench.run()
    table = Table(title="gpulab benchmarks")
    for col in ("metric", "value", "unit", "aim"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for r in rows:
        v = r["value"]
        table.add_row(str(r["metric"]), f"{v:,.1f}" if isinstance(v, float) else str(v),
                      str(r["unit"]), str(r["aim"]))  # fmt: skip
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"host": platform.node(), "cpus": __import__("os").cpu_count(), "time": time.time()}
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
