import sys

# What the harness needs besides the standard library (pyproject.toml's `harness` extra and the stack).
DEPENDENCIES = ("pytest", "xdist", "pytest_timeout", "junitparser", "matplotlib", "torch", "torch_xla", "deepspeed")

try:
    from .cli import main
except ModuleNotFoundError as err:
    if (err.name or "").split(".")[0] not in DEPENDENCIES:
        raise
    print(f"harness: error: {err.name} is not installed; install the harness's dependencies with "
          "`pip install -e '.[harness]' -c constraints.txt` from the repository (or run it through tox)",
          file=sys.stderr)
    raise SystemExit(2) from None

raise SystemExit(main())
