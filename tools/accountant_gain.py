"""What the tightest certified accountant buys on the demo: the same runs, same seeds, calibrated
to the same (epsilon, 1e-5) by privdl 0.1's accounting (``--accountant rdp``: RDP, classic
conversion) and by the default (``tightest``: exact Gaussian, mu-GDP), side by side.

    python tools/accountant_gain.py --out experiments/results/accountant-gain \
        [--work runs/accountant-gain] [--epsilons 1,3,10] [--steps 400] [--seeds 3]

Every run is repeated over seeds 1..K (the model's initialisation, batches and noise; the data
split is the demo's, ``data_seed`` 1), the same seeds for both accountants. Writes ``OUT/gain.md``
(a markdown table: method, epsilon, the noise std each accountant calibrated, the noise saved,
final accuracy and test loss of each as mean +- sample std over the seeds, the accuracy gain
(mean of the per-seed differences), and the non-private D-SGD runs as a reference) and
``OUT/gain.json`` (the same rows with every seed's numbers, each run's privacy record and the
settings); the run records stay under ``WORK/<accountant>/eps-<E>/<algorithm>/seed-<K>``. Every
number in the table is read back from the runs' records.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from privdl.cli.demo import demo_configs
from privdl.loop import train
from privdl.registry import make_config

ACCOUNTANTS = ("rdp", "tightest")


def _final(run_dir: Path) -> dict[str, Any]:
    """The noise the run calibrated (its config.json) and its final evaluation (summary.json)."""
    cfg = json.loads((run_dir / "config.json").read_text())
    final = json.loads((run_dir / "summary.json").read_text())["final"]
    return {
        "sigma": cfg.get("sigma"),
        "sigma_cor": cfg.get("sigma_cor"),
        "accuracy": final.get("accuracy"),
        "loss": final.get("test_loss", final.get("loss")),
        "privacy": final.get("privacy"),
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    a = np.asarray(values, float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def _row(
    label: str, eps: float, old: list[dict[str, Any]], new: list[dict[str, Any]]
) -> dict[str, Any]:
    """One table row from the per-seed results of each accountant (same seeds, in order)."""
    sigma_old, sigma_new = old[0]["sigma"], new[0]["sigma"]
    for runs in (old, new):  # the calibration does not depend on the seed
        if any(r["sigma"] != runs[0]["sigma"] for r in runs):
            raise SystemExit(f"{label} eps {eps}: sigma differs between seeds")
    priv_old, priv_new = old[0]["privacy"] or {}, new[0]["privacy"] or {}
    acc_old, acc_new = [r["accuracy"] for r in old], [r["accuracy"] for r in new]
    gain = [b - a for a, b in zip(acc_old, acc_new, strict=True)]
    return {
        "method": label,
        "epsilon": eps,
        "sigma_rdp": sigma_old,
        "sigma_tightest": sigma_new,
        "sigma_cor_rdp": old[0]["sigma_cor"],
        "sigma_cor_tightest": new[0]["sigma_cor"],
        "noise_saved": 1.0 - sigma_new / sigma_old,
        "variance_ratio": (sigma_new / sigma_old) ** 2,
        "accuracy_rdp": _mean_std(acc_old),
        "accuracy_tightest": _mean_std(acc_new),
        "accuracy_gain": _mean_std(gain),
        "loss_rdp": _mean_std([r["loss"] for r in old]),
        "loss_tightest": _mean_std([r["loss"] for r in new]),
        "seeds": {
            "accuracy_rdp": acc_old,
            "accuracy_tightest": acc_new,
            "loss_rdp": [r["loss"] for r in old],
            "loss_tightest": [r["loss"] for r in new],
        },
        "accountant_rdp": priv_old.get("accountant"),
        "accountant_tightest": priv_new.get("accountant"),
        "epsilon_rdp": priv_old.get("epsilon"),
        "epsilon_tightest": priv_new.get("epsilon"),
        "privacy_rdp": old[0]["privacy"],
        "privacy_tightest": new[0]["privacy"],
    }


def _pm(ms: tuple[float, float], fmt: str = ".4f", scale: float = 1.0) -> str:
    m, sd = ms
    return f"{scale * m:{fmt}} ± {scale * sd:{fmt.lstrip('+')}}"


def _markdown(rows: list[dict[str, Any]], baseline: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "| method | eps | sigma (rdp, classic) | sigma (tightest) | noise saved | variance ratio "
        "| accuracy rdp | accuracy tightest | accuracy gain (pt) | loss rdp | loss tightest "
        "| accountant (rdp / tightest) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['epsilon']:g} | {r['sigma_rdp']:.4g} | "
            f"{r['sigma_tightest']:.4g} | {100 * r['noise_saved']:.1f}% | "
            f"{r['variance_ratio']:.3f} | {_pm(r['accuracy_rdp'])} | "
            f"{_pm(r['accuracy_tightest'])} | {_pm(r['accuracy_gain'], '+.2f', 100.0)} | "
            f"{_pm(r['loss_rdp'])} | {_pm(r['loss_tightest'])} | "
            f"{r['accountant_rdp']} / {r['accountant_tightest']} |"
        )
    seeds = meta["seeds"]
    lines += [
        "",
        f"Non-private reference ({baseline['method']}, the same seeds): accuracy "
        f"{_pm(baseline['accuracy'])}, test loss {_pm(baseline['loss'])}.",
        "",
        f"Settings: {meta['task']}, {meta['steps']} steps, seeds {seeds[0]}..{seeds[-1]} "
        f"(mean ± sample std over {len(seeds)}; data split seed {meta['data_seed']}), delta "
        f"{meta['delta']:g}, graph {meta['graph']}; sigma is the noise std of each method's step "
        "as calibrated (sigma_cdp for DECOR; its sigma_cor shrinks by the same factor, see "
        "gain.json). rdp = `--accountant rdp` (privdl 0.1: RDP, classic conversion); tightest = "
        "the default. Accuracy gain: mean ± std of the per-seed differences.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("experiments/results/accountant-gain"))
    p.add_argument("--work", type=Path, default=Path("runs/accountant-gain"))
    p.add_argument("--epsilons", default="1,3,10")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    t0, commit = time.perf_counter(), _commit()  # the code the runs use
    epsilons = [float(e) for e in args.epsilons.split(",")]
    seeds = list(range(1, args.seeds + 1))
    rows = []
    base_runs: list[dict[str, Any]] = []
    base_label = ""
    for eps in epsilons:
        results: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for accountant in ACCOUNTANTS:
            for label, values in demo_configs(steps=args.steps, epsilon=eps, accountant=accountant):
                for seed in seeds:
                    cfg = make_config({**values, "label": label, "seed": seed})
                    if "epsilon" not in values:
                        if len(base_runs) == len(seeds):
                            continue  # non-private: depends on neither epsilon nor accountant
                        d = args.work / "non-private" / cfg.algorithm / f"seed-{seed}"
                        train(cfg, d, progress=False, overwrite=True)
                        base_runs.append(_final(d))
                        base_label = label
                        continue
                    d = args.work / accountant / f"eps-{eps:g}" / cfg.algorithm / f"seed-{seed}"
                    train(cfg, d, progress=False, overwrite=True)
                    results.setdefault(label, {}).setdefault(accountant, []).append(_final(d))
        for label, by in results.items():
            rows.append(_row(label, eps, by["rdp"], by["tightest"]))
    baseline = {
        "method": base_label,
        "accuracy": _mean_std([r["accuracy"] for r in base_runs]),
        "loss": _mean_std([r["loss"] for r in base_runs]),
        "seeds": {"accuracy": [r["accuracy"] for r in base_runs]},
    }
    ref = demo_configs(steps=args.steps, epsilon=epsilons[0])[1][1]
    meta = {
        "command": "python tools/accountant_gain.py "
        f"--out {args.out} --epsilons {args.epsilons} --steps {args.steps} --seeds {args.seeds}",
        "steps": args.steps,
        "seeds": seeds,
        "data_seed": ref["data_seed"],
        "delta": ref["delta"],
        "graph": ref["graph"],
        "task": ref["task"],
        "commit": commit,
        "platform": platform.platform(),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "non_private": baseline, "rows": rows}
    (args.out / "gain.json").write_text(json.dumps(doc, indent=1) + "\n")
    table = _markdown(rows, baseline, meta)
    (args.out / "gain.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
