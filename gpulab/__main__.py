"""`python -m gpulab` is the `gpulab` command."""

from gpulab.cli import main

raise SystemExit(main())
