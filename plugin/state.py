"""Device state, kept the way kubelet's device manager keeps its own: one lock, explicit
health per device, a version bumped on every real change, observers woken once per change.

A resource's devices are GPU replicas (`<gpu id>` or `<gpu id>::<k>` when time-sliced) or
plain counted ids (`rdma-0` ...). Health is set per GPU, so a fault marks every replica of
that GPU — NVIDIA's plugin marks only one (a bug this plugin does not copy).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from plugin.devices import Gpu
from plugin.mig import MigDevice

ANY = 0xFFFFFFFF  # NVML's "no GPU/compute instance": an event for the whole GPU


@dataclass(frozen=True)
class Device:
    id: str
    gpu: Gpu | None = None  # None for counted extra resources; a MIG device's parent
    mig: MigDevice | None = None

    def on(self, gpu_index: int, gi: int = ANY, ci: int = ANY) -> bool:
        """Whether a fault on that GPU (or on one of its GPU/compute instances) hits it."""
        if self.gpu is None or self.gpu.index != gpu_index:
            return False
        if self.mig is None or gi == ANY:
            return True  # a whole-GPU event reaches every slice of it
        return self.mig.gi == gi and (ci == ANY or self.mig.ci == ci)

    @property
    def numa(self) -> int | None:
        return self.gpu.numa if self.gpu else None


class ResourceState:
    def __init__(self, resource: str, devices: list[Device]) -> None:
        self.resource = resource
        self.devices = devices
        self.by_id = {d.id: d for d in devices}
        self._healthy = {d.id: True for d in devices}
        self._reason: dict[str, str] = {}
        self._version = 0
        self._cond = threading.Condition()

    def set_gpu_health(self, gpu_index: int, healthy: bool, reason: str = "",
                       gi: int = ANY, ci: int = ANY) -> list[str]:  # fmt: skip
        """Mark every device of that GPU, or of one of its MIG slices; returns the ids
        whose health changed."""
        with self._cond:
            changed = [
                d.id for d in self.devices
                if d.on(gpu_index, gi, ci) and self._healthy[d.id] != healthy
            ]  # fmt: skip
            for i in changed:
                self._healthy[i] = healthy
                if healthy:
                    self._reason.pop(i, None)
                else:
                    self._reason[i] = reason
            if changed:
                self._version += 1
                self._cond.notify_all()
            return changed

    def healthy(self, device_id: str) -> bool:
        with self._cond:
            return self._healthy.get(device_id, False)

    def reason(self, device_id: str) -> str:
        with self._cond:
            return self._reason.get(device_id, "")

    def snapshot(self) -> tuple[int, list[tuple[Device, bool]]]:
        with self._cond:
            return self._version, [(d, self._healthy[d.id]) for d in self.devices]

    def wake(self) -> None:
        """Wake every wait_newer now, so one whose `stop` was set sees it (a stopping
        server's streams end at once, not at their next timeout)."""
        with self._cond:
            self._cond.notify_all()

    def wait_newer(self, version: int, timeout: float,
                   stop: threading.Event | None = None) -> int:  # fmt: skip
        """Block until the version moves past `version`, `stop` is set (and wake() called)
        or the timeout; returns the version. `stop` is in the wait's own condition: a wake
        alone re-checked only the version and slept on to the timeout, so every stop of a
        server waited out its 0.5 s grace for the ListAndWatch stream."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._version != version or (stop is not None and stop.is_set()),
                timeout,
            )
            return self._version
