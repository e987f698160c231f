"""The `evaluate --plots` figures of an evaluation (`core.metrics.Evaluation`) as PNG files."""

from __future__ import annotations

from pathlib import Path


def write_plots(ev, folder: str) -> list[Path]:
    """confusion.png, reliability.png and coverage.png in `folder`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 5))
    m = ev.confusion
    ax.imshow(m, cmap="Blues")
    ax.set_xticks(range(len(ev.labels)), ev.labels, rotation=45, ha="right")
    ax.set_yticks(range(len(ev.labels)), ev.labels)
    for i in range(len(ev.labels)):
        for j in range(len(ev.labels)):
            ax.text(j, i, str(m[i, j]), ha="center", va="center", fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(f"confusion matrix ({ev.name}, accuracy {ev.accuracy:.3f})")
    save(fig, "confusion.png")

    fig, ax = plt.subplots(figsize=(5, 5))
    rel = ev.reliability()
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.plot([r[1] for r in rel], [r[0] for r in rel], marker="o", label=f"{ev.name} (ECE {ev.ece:.3f})")
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title("reliability diagram")
    ax.legend()
    save(fig, "reliability.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    curve = ev.coverage_curve()
    ax.plot([c[1] for c in curve], [c[2] for c in curve])
    if ev.target_accuracy is not None:
        ax.axhline(ev.target_accuracy, color="red", linestyle="--", label=f"target {ev.target_accuracy:.2f}")
        ax.legend()
    ax.set_xlabel("coverage (share of items auto-labelled)")
    ax.set_ylabel("accuracy on auto-labelled items")
    ax.set_title("coverage vs accuracy")
    ax.grid(alpha=0.3)
    save(fig, "coverage.png")
    return paths
