"""Health from NVML events: Xids (NVIDIA's ignore rules), double-bit ECC, lost GPUs, and
recovery when the driver's recovery action returns to NONE (an event, never polled).

One thread, one event set, as NVIDIA's plugin has; unlike it, a lost GPU marks only that
GPU (found by probing handles), and with policy `recover` a GPU comes back to Healthy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pynvml as nv

from plugin.config import XidPolicy
from plugin.devices import Gpu

log = logging.getLogger("gpulab-plugin")
WAIT_MS = 200  # how long stop() may wait on the thread (a pod's shutdown); NVML wakes us on events
XID = nv.nvmlEventTypeXidCriticalError
DBE = nv.nvmlEventTypeDoubleBitEccError
SBE = nv.nvmlEventTypeSingleBitEccError
RECOVERY = nv.nvmlEventTypeGpuRecoveryAction
SetHealth = Callable[..., None]  # (gpu index, healthy, reason[, gi, ci]): one slice or all
READY_LINE = "Health monitor watching"  # tests wait for it before injecting faults


class HealthMonitor:
    def __init__(self, gpus: list[Gpu], policy: XidPolicy, recover: bool, double_bit_ecc: bool,
                 set_health: SetHealth) -> None:  # fmt: skip
        self.gpus = gpus
        self.policy = policy
        self.recover = recover
        self.double_bit_ecc = double_bit_ecc
        self.set_health = set_health
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)
        self._by_uuid = {g.uuid: g for g in gpus}

    def start(self) -> None:
        if not self.policy.monitoring:
            log.info("Health checks disabled (DP_DISABLE_HEALTHCHECKS)")
            return
        log.info("Ignoring the following XIDs for health checks: %s", sorted(self.policy.ignored))
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop watching; with wait=False only ask (its NVML wait ends within WAIT_MS), so a
        caller can stop other things meanwhile and call stop() again to join."""
        self._stop.set()
        if wait and self._thread.is_alive():
            self._thread.join(timeout=5)

    def _register(self) -> object:
        es = nv.nvmlEventSetCreate()
        for g in self.gpus:
            h = nv.nvmlDeviceGetHandleByUUID(g.uuid)
            mask = (XID | DBE | SBE | RECOVERY) & nv.nvmlDeviceGetSupportedEventTypes(h)
            nv.nvmlDeviceRegisterEvents(h, mask, es)
        return es

    def _run(self) -> None:
        nv.nvmlInit()
        try:
            es = self._register()
        except nv.NVMLError as e:
            log.error("Failed to register for NVML events: %s; marking all devices unhealthy", e)
            for g in self.gpus:
                self.set_health(g.index, False, f"event registration failed: {e}")
            nv.nvmlShutdown()
            return
        self._probe()  # after registering: a fault from here on is an event we will see
        log.info("%s %d GPUs for NVML events", READY_LINE, len(self.gpus))
        try:
            while not self._stop.is_set():
                try:
                    event = nv.nvmlEventSetWait_v2(es, WAIT_MS)
                except nv.NVMLError as e:
                    self._on_error(e)
                    continue
                self._on_event(event)
        finally:
            nv.nvmlEventSetFree(es)
            nv.nvmlShutdown()

    def _probe(self) -> None:
        """Health that outlives events: a GPU lost, or one the driver wants reset. Read at
        every start, so a restarted plugin does not hand out a GPU that failed before."""
        field = nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        for g in self.gpus:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(g.uuid)
                (value,) = nv.nvmlDeviceGetFieldValues(h, [field])
            except nv.NVMLError_GpuIsLost:
                self.set_health(g.index, False, "GPU is lost")
                continue
            except nv.NVMLError as e:
                log.warning("Cannot read the recovery action of %s: %s", g.uuid, e)
                continue
            action = value.value.uiVal if value.nvmlReturn == nv.NVML_SUCCESS else 0
            if action != nv.NVML_GPU_RECOVERY_ACTION_NONE:
                self.set_health(g.index, False, f"driver asks for recovery action {action}")

    def _on_error(self, err: nv.NVMLError) -> None:
        if err.value == nv.NVML_ERROR_TIMEOUT:
            return
        if err.value == nv.NVML_ERROR_GPU_IS_LOST:
            self._mark_lost()
            return
        log.warning("NVML event wait failed: %s", err)
        self._stop.wait(1.0)  # back off; never spin on a persistent error

    def _mark_lost(self) -> None:
        """The wait says some GPU is lost, not which: ask NVML for each one."""
        for g in self.gpus:
            try:
                nv.nvmlDeviceGetHandleByUUID(g.uuid)
            except nv.NVMLError_GpuIsLost:
                self.set_health(g.index, False, "GPU is lost")

    def _on_event(self, e: object) -> None:
        try:
            uuid = nv.nvmlDeviceGetUUID(e.device)  # type: ignore[attr-defined]
        except nv.NVMLError:
            self._mark_lost()
            return
        gpu = self._by_uuid.get(uuid)
        if gpu is None:
            return
        kind, data = e.eventType, e.eventData  # type: ignore[attr-defined]
        # A MIG slice's fault names its GPU and compute instance; 0xFFFFFFFF: the whole GPU.
        where = (e.gpuInstanceId, e.computeInstanceId)  # type: ignore[attr-defined]
        if kind == XID:
            if self.policy.critical(data):
                log.info("XidCriticalError: Xid=%d on Device=%s (gi=%d, ci=%d); marking device "
                         "as unhealthy.", data, uuid, *where)  # fmt: skip
                self.set_health(gpu.index, False, f"Xid {data}", *where)
            else:
                log.info("Skipping event Xid=%d on Device=%s (ignored Xid)", data, uuid)
        elif kind == DBE and self.double_bit_ecc:
            self.set_health(gpu.index, False, "double-bit ECC error", *where)
        elif kind == RECOVERY and data == nv.NVML_GPU_RECOVERY_ACTION_NONE and self.recover:
            # Marking unhealthy is the Xid policy's job (DP_* rules); this only heals.
            log.info("Device=%s recovered (recovery action NONE); marking it healthy.", uuid)
            self.set_health(gpu.index, True, "")
