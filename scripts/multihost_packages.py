"""Install what the multi-host test bed (harness/multihost.py) needs from Debian's packages (pdsh,
openssh-server, openssh-client), where missing and where this is root with apt-get; standard library only.

    python scripts/multihost_packages.py

Prints one line: installed, present, or why the bed cannot run here (its checks are then skipped with that
reason). Exits non-zero only when an installation was tried and failed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import multihost  # noqa: E402

try:
    installed = multihost.ensure_packages()
except multihost.HostBedError as error:
    sys.exit(f"multihost: {error}")
reason = multihost.unavailable()
print(f"multihost: {reason}" if reason else
      f"multihost: test bed ready ({'installed ' + ', '.join(installed) if installed else 'packages present'})")
