"""Build, once, the environment with the pinned XLA stack that tox envs share.

torch + torch_xla + deepspeed make a ~7 GB environment. tox rebuilds an environment
whenever another env name used it last, so the heavy one lives outside tox's own
bookkeeping: tox envs call this, then run the stack's Python. It is rebuilt only when
constraints.txt, pyproject.toml or the requested extras change.

    python scripts/xla_stack.py ENV_DIR EXTRAS     (EXTRAS: comma-separated, e.g. harness)
"""

import hashlib
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INPUTS = ("constraints.txt", "pyproject.toml")


def fingerprint(extras):
    digest = hashlib.sha256(extras.encode())
    for name in INPUTS:
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: python scripts/xla_stack.py ENV_DIR EXTRAS")
    env_dir, extras = Path(argv[0]), argv[1]
    stamp = env_dir / ".xla-stack-fingerprint"
    wanted = fingerprint(extras)
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    print(f"xla_stack: building {env_dir} (torch, torch_xla, deepspeed; a few minutes the first time)", flush=True)
    venv.create(env_dir, with_pip=True, clear=stamp.is_file())
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["-c", str(REPO / "constraints.txt"), "-e", f"{REPO}[{extras}]"], check=True)
    stamp.write_text(wanted)


if __name__ == "__main__":
    main(sys.argv[1:])
