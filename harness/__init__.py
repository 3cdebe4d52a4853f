"""Conformance harness for DeepSpeed XLA accelerators.

`python -m harness run ...` (commands/run.py) runs the pytest suite under `conformance/` in a
child process with the candidate installed (session/plugin.py), then turns what the child
recorded into report.json, junit.xml and report.md (report/).
"""
