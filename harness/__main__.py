"""`python -m harness`: runs cli.main() and exits with the status it returns (cli.py's docstring: 0, 1, 2 on bad usage);
a missing harness dependency (pytest, torch_xla, DeepSpeed, ...) is one line on stderr and exit 2, not a traceback."""

import sys

# What the harness needs besides the standard library (pyproject.toml's `harness` extra and the stack).
DEPENDENCIES = ("pytest", "xdist", "pytest_timeout", "junitparser", "matplotlib", "torch", "torch_xla", "deepspeed")

try:
    from harness.cli import main
except ModuleNotFoundError as err:
    if (err.name or "").split(".")[0] not in DEPENDENCIES:
        raise
    print(f"harness: error: {err.name} is not installed; install the harness's dependencies with "
          "`pip install -e '.[harness]' -c constraints.txt` from the repository (or run it through tox)",
          file=sys.stderr)
    raise SystemExit(2) from None

raise SystemExit(main())
