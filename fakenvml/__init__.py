"""fakenvml: a fake NVIDIA GPU for machines that have none.

The C data plane (libnvidia-ml.so.1) answers NVML calls from a node's state directory;
this package is the control plane that writes that directory and injects faults.
"""

from fakenvml.errors import FakeNvmlError

__all__ = ["FakeNvmlError"]
