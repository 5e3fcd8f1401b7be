"""Subjects deployed from a Helm chart: the chart found — a directory, or one shipped inside
a Go module in gpulab's module cache (NVIDIA's k8s-device-plugin carries its chart in
deployments/helm/nvidia-device-plugin) — and rendered on the host with `helm template`
(no cluster, no Tiller) into the manifests a lab applies like any other subject's.

Image placeholders work as in a DaemonSet manifest: values may say "${SUBJECT_IMAGE}", or
"${SUBJECT_IMAGE_REPOSITORY}" and "${SUBJECT_IMAGE_TAG}" for charts that take an image in
two parts; helm passes them through and the lab fills them in (Subject.render).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from fakenvml import paths


class ChartError(Exception):
    """The chart cannot be found or rendered; one line."""


def escape_module(path: str) -> str:
    """A module path as the module cache spells it on disk (upper case as '!' + lower)."""
    return "".join(f"!{c.lower()}" if c.isupper() else c for c in path)


def module_cache() -> Path:
    """gpulab's Go module cache (clusters/infra/nodeimage/lib.sh's GOMODCACHE)."""
    return paths.cache_dir() / "go" / "mod"


def module_dir(module_at_version: str) -> Path:
    """Where a module version's source lies in gpulab's module cache (it may not yet)."""
    module, _, version = module_at_version.partition("@")
    return module_cache() / f"{escape_module(module)}@{version}"


def split_image(ref: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; a ref without a tag is `latest`."""
    repo, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:  # the colon was a registry's port, or there was none
        return ref, "latest"
    return repo, tag


def run(helm: str, args: list[str], kubeconfig: Path | None = None,
        timeout_s: float = 120) -> str:  # fmt: skip
    """helm with its config, cache and data dirs in a temporary directory (so it writes
    nothing elsewhere) and, for commands that talk to a cluster, that cluster's kubeconfig;
    its stdout. ChartError with helm's words on one line when it fails."""
    with tempfile.TemporaryDirectory(prefix="gpulab-helm-") as tmp:
        env = {**os.environ, **{f"HELM_{k}_HOME": str(Path(tmp) / k.lower())
                                for k in ("CACHE", "CONFIG", "DATA")}}  # fmt: skip
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        try:
            res = subprocess.run([helm, *args], capture_output=True, text=True, env=env,
                                 timeout=timeout_s, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ChartError(f"helm {args[0]}: {e}") from None
    if res.returncode != 0:
        # Charts' `fail` messages span lines: one line, helm's words.
        raise ChartError(f"helm {args[0]}: {' '.join((res.stderr or res.stdout).split())}")
    return res.stdout


def values_file(values: dict[str, Any], where: Path) -> Path:
    """The values as a file helm reads with --values."""
    path = where / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def install(helm: str, chart: Path, release: str, namespace: str, values: dict[str, Any],
            kubeconfig: Path, timeout_s: int) -> str:  # fmt: skip
    """`helm upgrade --install --wait` of the chart as a release (namespace created)."""
    with tempfile.TemporaryDirectory(prefix="gpulab-values-") as tmp:
        args = ["upgrade", "--install", release, str(chart), "--namespace", namespace,
                "--create-namespace", "--values", str(values_file(values, Path(tmp))),
                "--wait", "--timeout", f"{timeout_s}s"]  # fmt: skip
        return run(helm, args, kubeconfig, timeout_s + 30)


def template(helm: str, chart: Path, release: str, namespace: str, values: dict[str, Any],
             kube_version: str, include_crds: bool = False) -> str:  # fmt: skip
    """`helm template` of the chart: the manifests as one YAML stream."""
    with tempfile.TemporaryDirectory(prefix="gpulab-values-") as tmp:
        args = ["template", release, str(chart), "--namespace", namespace,
                "--kube-version", kube_version, "--values", str(values_file(values, Path(tmp))),
                *(["--include-crds"] if include_crds else [])]  # fmt: skip
        try:
            return run(helm, args)
        except ChartError as e:
            why = str(e).removeprefix("helm template: ")
            raise ChartError(f"helm template {chart}: {why}") from None
