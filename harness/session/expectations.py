"""Expected failures per candidate and backend: fixtures/expectations/<candidate>-<backend>.toml.

    [[expected_failure]]
    id = "conformance/test_interface_memory.py::test_total_memory"   # `*` matches anything
    reason = "why it fails"
    link = "https://github.com/... (issue tracking it)"

A failure matching an entry becomes xfailed; a matched test that passes is xpassed; an
entry matching no test is reported as unmatched. Both are reported, neither fails the run.
"""

from dataclasses import dataclass
from pathlib import Path

import tomllib

from harness.paths import EXPECTATIONS
from harness.session.suites import id_matches


class ExpectationsError(ValueError):
    """A malformed expectations file (bad usage)."""


@dataclass(frozen=True)
class Expectation:
    """One [[expected_failure]] entry: a test `id` pattern (`*` matches anything), why it fails and the issue tracking it."""
    id: str
    reason: str
    link: str

    def matches(self, test_id):
        """Whether `test_id` (a report result id) is one this entry's pattern names (suites.id_matches: only `*` is special)."""
        return id_matches(self.id, test_id)

    def concerns(self, module):
        """True when the entry names tests of `module` (a repository-relative path)."""
        return id_matches(self.id.split("::", 1)[0], module)


def default_path(candidate_name, backend):
    """fixtures/expectations/<candidate_name>-<backend>.toml, the file `run` reads without --expectations (may not exist)."""
    return EXPECTATIONS / f"{candidate_name}-{backend}.toml"


def load(path):
    """Expectations listed in `path`; none when the file does not exist."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ExpectationsError(f"{path}: not valid TOML: {err}") from None
    entries = data.get("expected_failure", [])
    if not isinstance(entries, list):
        raise ExpectationsError(f"{path}: expected_failure must be an array of tables ([[expected_failure]])")
    expectations = []
    for number, entry in enumerate(entries, 1):
        missing = [key for key in ("id", "reason", "link") if not str(entry.get(key, "")).strip()]
        if missing:
            raise ExpectationsError(f"{path}: expected_failure #{number} lacks {', '.join(missing)} "
                                    "(id, reason and link are required)")
        expectations.append(Expectation(entry["id"], entry["reason"], entry["link"]))
    return expectations


def apply(results, expectations):
    """Reclassify `results` (report.json result dicts, changed in place) by `expectations`.

    Returns the expectations that matched no result, as dicts for the report.
    """
    used = set()
    for result in results:
        expectation = next((e for e in expectations if e.matches(result["id"])), None)
        if expectation is None:
            continue
        used.add(expectation)
        result["expectation"] = {"reason": expectation.reason, "link": expectation.link}
        if result["status"] == "failed":
            result["status"] = "xfailed"
        elif result["status"] == "passed":
            result["status"] = "xpassed"
    return [{"id": e.id, "reason": e.reason, "link": e.link} for e in expectations if e not in used]
