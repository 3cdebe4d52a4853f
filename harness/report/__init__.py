"""A run's reports: the run directory (run_dir.py), report.json from the recorded events (report_json.py),
junit.xml (report_junit.py), report.md (report_md.py), loss-curve plots (curves.py), writing all three
(report_files.py) and comparing two runs (report_diff.py)."""
