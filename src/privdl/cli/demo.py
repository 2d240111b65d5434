"""The README's main job: DECOR vs LDP vs CDP vs non-private D-SGD on a9a over ``ring:16``.

Logistic regression on the a9a rebuild of UCI Adult (shipped inside privdl), 16 users on a ring,
user-level privacy at the same (epsilon, 1e-5) for every private method against an external
eavesdropper (DECOR's adversary I), following the DECOR paper's Fig. 1b setting at a smaller T.
Another graph can be given; ``seeds > 1`` repeats every method over seeds 1..K and reports the
mean ± sample standard deviation.
"""

from __future__ import annotations

from pathlib import Path

from privdl.errors import ConfigError
from privdl.loop import train
from privdl.registry import make_config
from privdl.report import load_runs, markdown_table, write_report


#: The four runs of the demo: (label, config changes).
def demo_configs(
    *, steps: int, epsilon: float, graph: str = "ring:16", accountant: str = "tightest"
) -> list[tuple[str, dict]]:
    base = dict(
        task="a9a",
        graph=graph,
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
    private = dict(
        clip=0.1, clip_mode="batch_mean", epsilon=epsilon, delta=1e-5, accountant=accountant
    )
    return [
        ("D-SGD (non-private)", {**base, "algorithm": "dsgd", "lr": 0.5}),
        ("CDP (trusted averaging, W=J)", {**base, **private, "algorithm": "cdp", "lr": 0.1}),
        (
            f"DECOR ({graph})",
            {**base, **private, "algorithm": "decor", "lr": 0.05, "adversary": "eavesdropper"},
        ),
        (f"LDP ({graph})", {**base, **private, "algorithm": "ldp", "lr": 0.02}),
    ]


def run_demo(
    out: Path,
    *,
    steps: int = 400,
    epsilon: float = 10.0,
    graph: str = "ring:16",
    seeds: int = 1,
    progress=None,
    overwrite: bool = False,
    accountant: str = "tightest",
) -> tuple[str, Path]:
    """Run the four configurations (each over ``seeds`` seeds) into ``out/<name>[/seed-K]`` and
    write ``out/report.md`` + plots; returns the table (mean ± std over seeds) and the report.
    An ``out`` that already holds a demo's records is refused unless ``overwrite`` (records are
    never replaced silently). ``accountant="rdp"`` calibrates as privdl 0.1 did (RDP, classic
    conversion), to see what the tightest default saves."""
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    out = Path(out)
    plan = []
    for label, values in demo_configs(
        steps=steps, epsilon=epsilon, graph=graph, accountant=accountant
    ):
        for seed in range(1, seeds + 1):
            cfg = make_config({**values, "label": label, "seed": seed})
            d = out / cfg.algorithm if seeds == 1 else out / cfg.algorithm / f"seed-{seed}"
            plan.append((cfg, d))
    held = [d for _, d in plan if d.exists() and any(d.iterdir())]
    if held and not overwrite:
        raise ConfigError(
            f"{out} already holds a demo's records ({held[0]}); pass --overwrite to replace "
            "them, or choose another --out"
        )
    dirs = []
    for cfg, d in plan:
        train(cfg, d, progress=progress, overwrite=True)
        dirs.append(d)
    runs = load_runs(dirs)
    return markdown_table(runs), write_report(runs, out)
