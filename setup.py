"""pyproject.toml holds the project; this adds one build step to it: the device plugin
API's gRPC modules, generated into every wheel from plugin/api/v1beta1/api.proto (they
are build products, gitignored), so an installed gpulab-plugin never lacks them."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithApi(build_py):
    def run(self) -> None:
        super().run()
        sys.path.insert(0, str(HERE))
        from plugin.api.generate import generate

        generate(Path(self.build_lib).resolve())


setup(cmdclass={"build_py": BuildPyWithApi})
