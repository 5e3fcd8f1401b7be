"""The node-tier fixtures come from standin.pytest_plugin, which the package
registers as the `gpulab_standin` pytest11 entry point; registered here too when this
checkout's install predates that entry point. The gRPC modules are build products
(`python -m plugin.api.generate`); a checkout without them gets them here. NVIDIA's
plugin binaries are `make infra`'s: a test that needs a missing one fails at once saying so."""

from __future__ import annotations

import pytest

import standin.pytest_plugin as standin_fixtures
from plugin.api import generate

if not all((generate.REPO / generate.PROTO.parent / name).exists() for name in generate.GENERATED):
    generate.generate()


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(standin_fixtures):
        config.pluginmanager.register(standin_fixtures, "gpulab_standin")
