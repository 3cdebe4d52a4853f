"""How every benchmark script starts and ends, as `python -m harness` does: DeepSpeed's ops load from
the stack's prebuilt directory, a stale op build lock there is refused in one line (every load of that
op would wait for it forever), and a Ctrl-C or SIGTERM ends the script with one line and exit 130.
What the scripts start gets `harness.child_processes.dies_with_parent` as its preexec_fn: killed when the
script ends, however it ends, so no rank outlives an interrupted benchmark."""

import sys
from pathlib import Path

from harness import child_processes, environment  # the scripts put the repository on sys.path before they import this


def run(main):
    """sys.exit(main()), after the build-lock check; exit 2 with one line for a stale lock, 130 on an interrupt."""
    prog = Path(sys.argv[0]).name
    child_processes.interrupts_raise()
    stale = environment.stale_lock_line(environment.stale_build_locks(environment.use_stack_extensions()))
    if stale:
        print(f"{prog}: error: {stale}", file=sys.stderr)
        sys.exit(2)
    try:
        status = main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        status = 130
    sys.exit(status)


def selected_rows(parser, only, rows):
    """The (stage, dtype, world) `rows` that `--only` names (STAGE-DTYPE or STAGE-DTYPE-WORLD, comma-separated), in
    table order; a name that matches no row is a usage error (exit 2, through `parser`), not an empty table."""
    names = [name for name in only.split(",") if name]
    keys = {(stage, dtype, world): {f"{stage}-{dtype}", f"{stage}-{dtype}-{world}"} for stage, dtype, world in rows}
    unknown = [name for name in names if not any(name in row_keys for row_keys in keys.values())]
    if not names or unknown:
        stages, dtypes, worlds = (sorted({str(row[i]) for row in rows}) for i in range(3))
        example = f"{'-'.join(map(str, rows[0]))},{rows[-1][0]}-{rows[-1][1]}"
        parser.error(f"--only {only!r}: " + (f"no row named {', '.join(unknown)}" if unknown else "names no row")
                     + f"; rows are STAGE-DTYPE or STAGE-DTYPE-WORLD with STAGE {'/'.join(stages)}, DTYPE "
                     f"{' or '.join(dtypes)}, WORLD {' or '.join(worlds)} (e.g. {example})")
    return [row for row, row_keys in keys.items() if row_keys & set(names)]
