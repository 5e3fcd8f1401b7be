"""The node-tier fixtures come from plugin.standin.pytest_plugin, which the package
registers as the `gpulab_standin` pytest11 entry point; registered here too when this
checkout's install predates that entry point. The gRPC modules are build products
(`python -m plugin.api.generate`); a checkout without them gets them here."""

from __future__ import annotations

import pytest

import plugin.standin.pytest_plugin as standin_fixtures
from plugin.api import generate

if not all((generate.REPO / generate.PROTO.parent / name).exists() for name in generate.GENERATED):
    generate.generate()


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(standin_fixtures):
        config.pluginmanager.register(standin_fixtures, "gpulab_standin")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the NVIDIA plugin versions the selected tests need before any test starts:
    a cold build takes minutes, which no per-test timeout should have to cover."""
    from plugin.standin import nvidia

    versions = set()
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "version" in params:
            versions.add(params["version"])
        elif getattr(params.get("subject"), "name", "").startswith("nvidia-"):
            versions.add(params["subject"].version)
    missing = [v for v in sorted(versions) if not nvidia.cached(v)]
    if not missing:
        return
    capture = session.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # show the build's progress lines
        for v in missing:
            nvidia.binary(v)
