"""Build, once, the environment with the pinned XLA stack that tox envs share.

torch + torch_xla + deepspeed make a ~7 GB environment. tox rebuilds an environment
whenever another env name used it last, so the heavy one lives outside tox's own
bookkeeping: tox envs call this, then run the stack's Python. It is rebuilt only when
constraints.txt, pyproject.toml or the requested extras change.

It also builds, once, the DeepSpeed C++ ops that DeepSpeed's CPU accelerator (the reference)
and deepspeed_xla's host-side kernels load, into ENV_DIR/torch_extensions
(TORCH_EXTENSIONS_DIR for everything run from the stack): no check ever JIT-builds, and no
other environment on the machine shares, rebuilds or locks these builds.

    python scripts/xla_stack.py ENV_DIR EXTRAS     (EXTRAS: comma-separated, e.g. harness)
"""

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INPUTS = ("constraints.txt", "pyproject.toml")
EXTENSIONS = "torch_extensions"
# The ops DeepSpeed's CPU accelerator loads (FusedAdam, DeepSpeedCPUAdam / offload, its shared-memory
# all-reduce) and deepspeed_xla's host-side kernels (DeepSpeed's CPU builders).
PREBUILT_OPS = ("FusedAdamBuilder", "CPUAdamBuilder", "ShareMemCommBuilder")
_BUILD_OPS = """
from deepspeed.accelerator import get_accelerator
for name in {ops!r}:
    get_accelerator().create_op_builder(name).load(verbose=False)
    print("xla_stack: built", name, flush=True)
"""


def fingerprint(extras):
    digest = hashlib.sha256(extras.encode())
    for name in INPUTS:
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()


def build_ops(env_dir):
    """Build PREBUILT_OPS into env_dir/torch_extensions (a no-op for ops already built there)."""
    stamp = env_dir / EXTENSIONS / ".prebuilt"
    if stamp.is_file() and stamp.read_text() == repr(PREBUILT_OPS):
        return
    # The stack's bin first on PATH: torch builds with the first ninja it finds, and a system ninja
    # of another version writes a build log the stack's ninja discards, rebuilding every op later.
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(env_dir / EXTENSIONS),
           "PATH": os.pathsep.join([str(env_dir / "bin"), os.environ.get("PATH", "")])}
    print(f"xla_stack: building DeepSpeed's CPU ops into {env_dir / EXTENSIONS} (a minute or two, once)", flush=True)
    subprocess.run([str(env_dir / "bin" / "python"), "-c", _BUILD_OPS.format(ops=PREBUILT_OPS)], env=env, check=True)
    stamp.write_text(repr(PREBUILT_OPS))


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: python scripts/xla_stack.py ENV_DIR EXTRAS")
    env_dir, extras = Path(argv[0]).resolve(), argv[1]
    stamp = env_dir / ".xla-stack-fingerprint"
    wanted = fingerprint(extras)
    if stamp.is_file() and stamp.read_text() == wanted:
        build_ops(env_dir)
        return
    print(f"xla_stack: building {env_dir} (torch, torch_xla, deepspeed; a few minutes the first time)", flush=True)
    venv.create(env_dir, with_pip=True, clear=stamp.is_file())
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["-c", str(REPO / "constraints.txt"), "-e", f"{REPO}[{extras}]"], check=True)
    stamp.write_text(wanted)
    build_ops(env_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
