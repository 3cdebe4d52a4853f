"""DeepSpeed's own unit tests against a candidate and DeepSpeed's CPU accelerator: the subcommand
(upstream.py), the selection file (upstream_selection.py), running each side (upstream_run.py) with its
recorder plugin (upstream_plugin.py), and the per-test verdicts (upstream_verdicts.py)."""
