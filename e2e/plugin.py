"""The `gpulab_e2e` pytest plugin: the suites' fixtures and hooks (e2e/fixtures.py), where
the lab's clients are installed (`gpulab[lab]`).

pytest loads every installed plugin in every run. A node's install (fakenvml and the
plugin: no kubernetes client) must not break its owner's own pytest runs, so there this
loads nothing.
"""

from __future__ import annotations

import importlib.util

pytest_plugins = ["e2e.fixtures"] if importlib.util.find_spec("kubernetes") else []
