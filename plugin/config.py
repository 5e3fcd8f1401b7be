"""The plugin's YAML config, validated; defaults in one place.

resource: nvidia.com/gpu
device_id_strategy: uuid        # uuid | index  (NVIDIA_VISIBLE_DEVICES contents)
mig_strategy: none              # none | single | mixed  (NVIDIA's, see plugin/mig.py)
replicas: 1                     # time-slicing: each GPU listed N times as <id>::<k>
extra_resources:                # counted resources served beside the GPUs (seeds' rdma)
  example.com/rdma: 10
health:
  policy: recover               # recover | sticky (NVIDIA's behaviour: never recovers)
  double_bit_ecc: true          # a double-bit ECC event makes the GPU unhealthy (the
                                # driver's Xid 48 for it follows the Xid rules below)
  disable: ""                   # DP_DISABLE_HEALTHCHECKS semantics; the env var wins
  enable: ""                    # DP_ENABLE_HEALTHCHECKS semantics; the env var wins
pre_start_required: false
cdi: false                      # also answer Allocate with CDI device names
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Application-level Xids NVIDIA's plugin always ignores: the workload's fault, not the GPU's.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class ConfigError(Exception):
    """A config the plugin refuses; the message is one line."""


# The lab's YAML files (inventories, lab specs, subjects, experiments) share one loader,
# fakenvml/yamlmodel.py; this config deliberately does not. The plugin is the product that
# runs on real GPUs, and importing fakenvml, the test double, would make it depend on the
# thing it is tested against: a change made for the lab's files would change what a
# cluster's ConfigMap accepts. It has no durations, its loader is a dozen lines, and its
# refusals keep the same `file: key: problem` one-line shape.
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Health(_Strict):
    policy: Literal["recover", "sticky"] = "recover"
    double_bit_ecc: bool = True
    disable: str = ""
    enable: str = ""


class Config(_Strict):
    resource: str = "nvidia.com/gpu"
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    mig_strategy: Literal["none", "single", "mixed"] = "none"
    replicas: int = Field(1, ge=1, le=64)
    extra_resources: dict[str, int] = Field(default_factory=dict)
    health: Health = Health()
    pre_start_required: bool = False
    cdi: bool = False

    @field_validator("resource")
    @classmethod
    def _resource_name(cls, v: str) -> str:
        if not _RESOURCE.fullmatch(v):
            raise ValueError(f"{v!r} is not an extended resource name like vendor.com/device")
        return v

    @field_validator("extra_resources")
    @classmethod
    def _extra(cls, v: dict[str, int]) -> dict[str, int]:
        for name, count in v.items():
            if not _RESOURCE.fullmatch(name):
                raise ValueError(f"{name!r} is not an extended resource name")
            if not 1 <= count <= 100000:
                raise ValueError(f"{name}: count must be 1-100000, not {count}")
        return v


def config_file(path: Path | None, env: dict[str, str] | None = None) -> Path | None:
    """A config path, or for a directory (a ConfigMap shared by nodes) the file for this
    node ($NODE_NAME.yaml) or else default.yaml; None when the directory has neither."""
    if path is None or not path.is_dir():
        return path
    node = (os.environ if env is None else env).get("NODE_NAME", "")
    for name in (f"{node}.yaml", "default.yaml") if node else ("default.yaml",):
        if (path / name).is_file():
            return path / name
    return None


def load(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} malformed YAML") from None
    if data is None:
        return Config()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping, found {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        raise ConfigError(f"{path}: {loc}: {err['msg']}") from None


def _xid_list(text: str, var: str) -> set[int]:
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ConfigError(f"{var}: {part!r} is not an Xid number")
        out.add(int(part))
    return out


class XidPolicy:
    """Which Xids make a GPU unhealthy, with NVIDIA's env semantics:
    DP_DISABLE_HEALTHCHECKS=all|xids disables all, a comma list adds to the ignored
    application Xids; DP_ENABLE_HEALTHCHECKS lists Xids checked regardless."""

    def __init__(self, health: Health, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        disable = env.get("DP_DISABLE_HEALTHCHECKS", health.disable).strip().lower()
        enable = env.get("DP_ENABLE_HEALTHCHECKS", health.enable).strip().lower()
        self.all_disabled = disable == "all" or "xids" in disable
        listed = enable not in ("", "all")
        self.enabled = _xid_list(enable, "DP_ENABLE_HEALTHCHECKS") if listed else set()
        self.enable_all = enable == "all"
        extra = set() if self.all_disabled else _xid_list(disable, "DP_DISABLE_HEALTHCHECKS")
        self.ignored = (DEFAULT_IGNORED_XIDS | extra) - self.enabled

    @property
    def monitoring(self) -> bool:
        """False when no Xid could ever matter: health checks are off entirely."""
        return not self.all_disabled or bool(self.enabled) or self.enable_all

    def critical(self, xid: int) -> bool:
        if self.enable_all or xid in self.enabled:
            return True
        return not self.all_disabled and xid not in self.ignored
