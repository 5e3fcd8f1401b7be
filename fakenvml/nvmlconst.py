"""NVML's numbers that the model, the state format and the control plane share (nvml.h).
A module of its own so that the state format can be read and written without importing
the model's dataclasses, which `fakenvml inject` never needs. The state format's own
numbers (FNV_* in src/state_format.h: MAX_LINKS, MAX_DEVICES, FIELD_UNKNOWN ...) are
fakenvml/layout.py's."""

from __future__ import annotations

# nvmlIntNvLinkDeviceType_t
LINK_REMOTE_GPU = 0
LINK_REMOTE_SWITCH = 2

# NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: a profile's link speed, where the GPU has links; the
# library answers the other NVLink fields (link count, per-link state and speed) from links.
FI_NVLINK_SPEED_MBPS_COMMON = 90

# nvmlValueType_t (a field id the driver rejects: layout.FIELD_UNKNOWN).
VALUE_DOUBLE, VALUE_UINT, VALUE_ULL, VALUE_SINT = 0, 1, 3, 5
