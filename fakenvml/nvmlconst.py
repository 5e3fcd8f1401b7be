"""NVML's numbers that the model, the state format and the control plane share (nvml.h).
A module of its own so that the state format can be read and written without importing
the model's dataclasses, which `fakenvml inject` never needs."""

from __future__ import annotations

MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvml.h 13.x; NVIDIA's plugin probes 0..35
MAX_DEVICES = 4096

# nvmlIntNvLinkDeviceType_t
LINK_REMOTE_GPU = 0
LINK_REMOTE_SWITCH = 2

# nvmlValueType_t, and a marker for field ids the driver rejects (INVALID_ARGUMENT).
VALUE_DOUBLE, VALUE_UINT, VALUE_ULL, VALUE_SINT = 0, 1, 3, 5
FIELD_UNKNOWN = 0xFFFFFFFF
