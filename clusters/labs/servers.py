"""What serves a lab's GPUs, chosen from its spec: NVIDIA's DRA driver where it says
`dra:` (its chart refuses to run beside a device plugin), NVIDIA's GPU Operator where it
says `operator:` (it deploys NVIDIA's plugin), else what `otherwise` makes (the subject)."""

from __future__ import annotations

from collections.abc import Callable

from clusters.labs import spec
from clusters.labs.dra import DraDriver
from clusters.labs.gpuoperator import GpuOperator
from clusters.labs.serving import Serving


def choose(lab: spec.Lab, otherwise: Callable[[], Serving]) -> Serving:
    if lab.spec.dra:
        return DraDriver(lab.spec.dra)
    if lab.spec.operator:
        return GpuOperator(lab.spec.operator)
    return otherwise()
