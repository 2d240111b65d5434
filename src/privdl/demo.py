"""The README's main job: DECOR vs LDP vs CDP vs non-private D-SGD on a9a over ``ring:16``.

Logistic regression on the a9a rebuild of UCI Adult (shipped inside privdl), 16 users on a ring,
user-level privacy at the same (epsilon, 1e-5) for every private method against an external
eavesdropper (DECOR's adversary I), following the DECOR paper's Fig. 1b setting at a smaller T.
"""

from __future__ import annotations

from pathlib import Path

from privdl.config import make_config
from privdl.report import make_report, privacy_text
from privdl.runner import train


#: The four runs of the demo: (label, config changes).
def demo_configs(*, steps: int, epsilon: float) -> list[tuple[str, dict]]:
    base = dict(
        task="a9a",
        graph="ring:16",
        mixing="metropolis",
        steps=steps,
        batch_size=64,
        sampling="without_replacement",
        partition="dirichlet:10",
        eval_every=max(1, steps // 20),
        seed=1,
        data_seed=1,
        weight_decay=1e-5,
    )
    private = dict(clip=0.1, clip_mode="batch_mean", epsilon=epsilon, delta=1e-5)
    return [
        ("D-SGD (non-private)", {**base, "algorithm": "dsgd", "lr": 0.5}),
        ("CDP (trusted averaging, W=J)", {**base, **private, "algorithm": "cdp", "lr": 0.1}),
        (
            "DECOR (ring:16)",
            {**base, **private, "algorithm": "decor", "lr": 0.05, "adversary": "eavesdropper"},
        ),
        ("LDP (ring:16)", {**base, **private, "algorithm": "ldp", "lr": 0.02}),
    ]


def run_demo(
    out: Path, *, steps: int = 400, epsilon: float = 10.0, progress=None
) -> tuple[str, Path]:
    """Run the four configurations into ``out/<name>`` and write ``out/report.md`` + plots."""
    out = Path(out)
    dirs = []
    rows = ["| method | test accuracy | train loss | privacy |", "|---|---|---|---|"]
    for label, values in demo_configs(steps=steps, epsilon=epsilon):
        cfg = make_config({**values, "label": label})
        d = out / cfg.algorithm
        summary = train(cfg, d, progress=progress, overwrite=True)
        final = summary["final"]
        rows.append(
            f"| {label} | {final['accuracy']:.4f} | {final['loss']:.4f} | "
            f"{privacy_text(final.get('privacy'))} |"
        )
        dirs.append(d)
    report = make_report(dirs, out)
    return "\n".join(rows), report
