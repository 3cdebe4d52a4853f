"""The subcommands of `python -m harness` that are not an area's own (upstream/upstream.py, report/report_diff.py):
each module has `add_parser(commands)` and `run(args)`, as those do."""
