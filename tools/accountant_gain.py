"""What the tightest certified accountant buys on the demo: the same runs, same seeds, calibrated
to the same (epsilon, 1e-5) by privdl 0.1's accounting (``--accountant rdp``: RDP, classic
conversion) and by the default (``tightest``: exact Gaussian, mu-GDP), side by side.

    python tools/accountant_gain.py --out runs/accountant-gain [--epsilons 1,3,10] [--steps 400]

Writes ``OUT/gain.md`` (a markdown table: method, epsilon, noise std of each accountant, the
variance ratio, final accuracy and loss of each) and ``OUT/gain.json``; the run records stay under
``OUT/<accountant>/eps-<E>/<algorithm>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/accountant-gain"))
    p.add_argument("--epsilons", default="1,3,10")
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    rows = []
    for eps in [float(e) for e in args.epsilons.split(",")]:
        results: dict[str, dict[str, dict[str, Any]]] = {}
        for accountant in ACCOUNTANTS:
            for label, values in demo_configs(steps=args.steps, epsilon=eps, accountant=accountant):
                if "epsilon" not in values:
                    continue  # the non-private baseline does not depend on the accountant
                cfg = make_config({**values, "label": label})
                d = args.out / accountant / f"eps-{eps:g}" / cfg.algorithm
                train(cfg, d, progress=False, overwrite=True)
                results.setdefault(label, {})[accountant] = _final(d)
        for label, by in results.items():
            old, new = by["rdp"], by["tightest"]
            rows.append(
                {
                    "method": label,
                    "epsilon": eps,
                    "sigma_rdp": old["sigma"],
                    "sigma_tightest": new["sigma"],
                    "sigma_cor_rdp": old["sigma_cor"],
                    "sigma_cor_tightest": new["sigma_cor"],
                    "variance_ratio": (new["sigma"] / old["sigma"]) ** 2 if old["sigma"] else None,
                    "accuracy_rdp": old["accuracy"],
                    "accuracy_tightest": new["accuracy"],
                    "loss_rdp": old["loss"],
                    "loss_tightest": new["loss"],
                    "label_rdp": old["privacy"]["accountant"] if old["privacy"] else None,
                    "label_tightest": new["privacy"]["accountant"] if new["privacy"] else None,
                    "epsilon_rdp": old["privacy"]["epsilon"] if old["privacy"] else None,
                    "epsilon_tightest": new["privacy"]["epsilon"] if new["privacy"] else None,
                }
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gain.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "| method | eps | sigma (rdp, classic) | sigma (tightest) | variance ratio | "
        "accuracy rdp | accuracy tightest | loss rdp | loss tightest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['epsilon']:g} | {r['sigma_rdp']:.4g} | "
            f"{r['sigma_tightest']:.4g} | {r['variance_ratio']:.3f} | {r['accuracy_rdp']:.4f} | "
            f"{r['accuracy_tightest']:.4f} | {r['loss_rdp']:.4f} | {r['loss_tightest']:.4f} |"
        )
    (args.out / "gain.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
