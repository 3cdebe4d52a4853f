"""Conformance harness for DeepSpeed XLA accelerators.

`python -m harness run ...` (cli.py) runs the pytest suite under `conformance/` in a
child process with the candidate installed (plugin.py), then turns what the child
recorded into report.json, junit.xml and report.md (report_*.py).
"""
