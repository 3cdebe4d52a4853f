"""Loss-curve plots for results whose evidence carries curves:
evidence={"reference": [loss, ...], "candidate": [loss, ...]}."""

import re
from pathlib import Path


def has_curves(evidence):
    """True when `evidence` holds non-empty "reference" and "candidate" loss lists (or tuples), the ones plot() draws."""
    return all(isinstance(evidence.get(key), (list, tuple)) and evidence[key] for key in ("reference", "candidate"))


def plot(evidence, path, title):
    """Write a PNG of reference vs candidate losses per step to `path`."""
    import matplotlib
    matplotlib.use("Agg")  # no display on CI machines and TPU VMs
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    try:
        for key, style in (("reference", "-o"), ("candidate", "--x")):
            values = [float(v) for v in evidence[key]]
            ax.plot(range(1, len(values) + 1), values, style, label=key, markersize=4)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(title, fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return Path(path)


def plot_results(results, out_dir):
    """Plot every result with curves into out_dir/curves/; {result id: path relative to out_dir}."""
    plots = {}
    for result in results:
        if not has_curves(result.get("evidence") or {}):
            continue
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", result["id"]).strip("_") + ".png"
        target = Path(out_dir) / "curves" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        plot(result["evidence"], target, result["id"])
        plots[result["id"]] = f"curves/{name}"
    return plots
