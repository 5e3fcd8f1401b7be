"""`python -m fakenvml` is the `fakenvml` command."""

from fakenvml.cli import main

raise SystemExit(main())
