"""One conformance run's pytest session: the plugin that records each check (plugin.py), outcomes and their
records (outcomes.py), suites and areas (suites.py), expected failures (expectations.py), the interface
checklist (checklist.py), and checks lost with a crashed xdist worker (xdist_crashes.py)."""
