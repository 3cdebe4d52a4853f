"""Before `tox -e tpu` installs anything: is this a TPU VM whose chips are free?

    python scripts/tpu_preflight.py

Exit 0 with one line naming the chips; exit 2 with one line on a machine without TPU chips
(nothing is installed or started), or when other processes hold the chips (naming their PIDs:
the process that opens the chips owns them, and the suite's ranks could not start). Needs
only the standard library: the chips are counted on the PCI bus, the holders found in /proc.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from xla_host.tpu_topology import PCI_DEVICES, chip_holders_line, count_tpu_chips  # noqa: E402


def preflight(sysfs_root=PCI_DEVICES, proc_root="/proc", own_pid=None):
    """(exit status, one line)."""
    chips = count_tpu_chips(sysfs_root)
    if chips == 0:
        return 2, ("tox -e tpu: this machine has no TPU chips on its PCI bus; run it on a TPU VM "
                   "(on this machine, PJRT CPU emulation: tox -e cpu)")
    held = chip_holders_line(proc_root, own_pid)
    if held:
        return 2, f"tox -e tpu: {held}"
    return 0, f"tox -e tpu: {chips} TPU chip{'s' if chips > 1 else ''} on this host, none held by another process"


def main():
    status, line = preflight()
    print(line, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main())
