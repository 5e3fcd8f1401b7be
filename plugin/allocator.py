"""GetPreferredAllocation: pick the best-connected devices, honouring must-include ids.

Greedy on pair scores (devices.Topology.score): seed with the must-include devices, or
else with the candidate best connected to all others; then repeatedly add the candidate
with the highest total score to the chosen set. O(n^2 + size * n * size) lookups, all
cached, so 64 GPUs answer in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def prefer(
    available: Sequence[int],
    must_include: Sequence[int],
    size: int,
    score: Callable[[int, int], int],
) -> list[int]:
    chosen = list(dict.fromkeys(must_include))[:size]
    pool = [d for d in dict.fromkeys(available) if d not in chosen]
    if not chosen and pool and size > 0:
        seed = max(pool, key=lambda d: (sum(score(d, o) for o in pool if o != d), -d))
        chosen.append(seed)
        pool.remove(seed)
    while len(chosen) < size and pool:
        best = max(pool, key=lambda d: (sum(score(d, c) for c in chosen), -d))
        chosen.append(best)
        pool.remove(best)
    return chosen
