"""Where the repository's parts are: every harness module takes its paths from here."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
CONFORMANCE = REPO / "conformance"
BENCHMARKS = REPO / "benchmarks"
REPORTS = REPO / "reports"  # the default; HARNESS_REPORTS_DIR moves it (run_dir.py)
TOLERANCES = FIXTURES / "tolerances.toml"
TRAINING_CASES = FIXTURES / "training_cases.toml"
REFERENCES = FIXTURES / "references"
EXPECTATIONS = FIXTURES / "expectations"
UPSTREAM_SELECTIONS = FIXTURES / "upstream"
CANDIDATE_SITE = Path(__file__).resolve().parent / "candidate" / "candidate_site"
