"""Black-box input canaries in a *shared* CNN: mislabelled images, all in one training run,
certified by the one-run bound (Steinke, Nasr and Jagielski 2023, Section 7's black-box
setting, where the canaries are mislabelled training images and the score is the loss).

Unlike the audits of :mod:`privdl.audit.examples` (one model coordinate per canary, independent
trials), the canaries here share every weight: they interfere, as in a real model. The run is
the task's own (``task="user"``: a dataset and an ``nn.Module``, built by the recipe as
``privdl.train`` builds it; Poisson sampling, per-example clipping, the expected batch size as
denominator, the algorithm's noise and, for the gossip family, its messages):

* the model is a small convolutional network *without biases* (conv 3x3, ReLU, conv 3x3, ReLU,
  linear): an all-zero image then has exactly zero gradient (every activation is 0 and
  ``ReLU'(0) = 0``), so an excluded canary's slot holds a zero image and the dataset size, the
  Poisson rate and the denominator do not depend on which canaries are in (add/remove, as in
  :func:`privdl.audit.examples.canary_data`);
* the data are ``base`` images of ``CLASSES`` classes (a class template plus pixel noise) and
  ``m`` canary slots; canary ``k`` is a fresh image of some class with a *wrong* label, included
  with probability 1/2;
* the score (black box, fixed before the run): minus the task's loss of canary ``k`` on the
  final model the threat model's adversary queries (:func:`privdl.audit.examples.
  black_box_nodes`; the mean over them when there are several).

For the gossip family the canaries sit at the threat model's canary node
(:func:`privdl.audit.gossip.gossip_view`) beside that node's base images; every other node holds
base images of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from privdl.algorithms.base import Keys
from privdl.errors import ConfigError

__all__ = ["CLASSES", "IMAGE", "build_cnn_run", "cnn_canaries", "cnn_canary_losses", "cnn_model"]

#: Classes and image side of the synthetic images.
CLASSES, IMAGE = 4, 8


def cnn_model() -> nn.Module:
    """The bias-free CNN (module docstring): 1x8x8 images, CLASSES logits."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, bias=False),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, stride=2, bias=False),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * (IMAGE // 2) ** 2, CLASSES, bias=False),
    )


def _images(rng: np.random.Generator, templates: np.ndarray, count: int) -> tuple[Any, Any]:
    """``count`` images: a random class's template plus N(0, 0.5^2) pixel noise, and the class."""
    label = rng.integers(0, CLASSES, count)
    x = templates[label] + 0.5 * rng.standard_normal((count, 1, IMAGE, IMAGE))
    return x.astype(np.float32), label


def cnn_canaries(canaries: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``canaries`` canary images and their (wrong) labels, from ``seed`` (public: the
    auditor crafts them)."""
    rng = np.random.default_rng([seed, 0xC44])
    x, label = _images(rng, _templates(seed), canaries)
    wrong = (label + rng.integers(1, CLASSES, canaries)) % CLASSES
    return torch.as_tensor(x), torch.as_tensor(wrong, dtype=torch.int64)


def _templates(seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 0x7E3]).standard_normal((CLASSES, 1, IMAGE, IMAGE))


def _base(count: int, seed: int, node: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, label = _images(np.random.default_rng([seed, 0xBA5, node + 1]), _templates(seed), count)
    return torch.as_tensor(x), torch.as_tensor(label, dtype=torch.int64)


def build_cnn_run(
    values: dict[str, Any],
    included: np.ndarray,
    *,
    sampling_rate: float,
    base: int,
    seed: int,
    canary_node: int | None = None,
    calibrated: Any = None,
) -> Any:
    """The run of a CNN one-run audit: the canary slots (canary ``k`` where ``included[k]``, a
    zero image otherwise) then ``base`` images at the canary node, ``len(included) + base``
    base images at every other node; the expected batch ``sampling_rate`` times the node's
    size; the noise calibrated to ``values``' epsilon as a run would (module docstring)."""
    from privdl.data.custom import user_data
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes
    from privdl.registry import make_config
    from privdl.tasks import UserObjects
    from privdl.topology import parse_topology

    m = len(included)
    if base < 0 or not 0 < sampling_rate <= 1:
        raise ConfigError("a CNN audit needs base images >= 0 and a sampling rate in (0, 1]")
    size = m + base
    x, y = cnn_canaries(m, seed)
    x = torch.where(torch.as_tensor(included)[:, None, None, None], x, torch.zeros_like(x))
    bx, by = _base(base, seed, -1)
    node_data = (torch.cat([x, bx]), torch.cat([y, by]))
    batch = max(1, round(sampling_rate * size))
    cfg = calibrated or make_config(
        {**values, "task": "user", "batch_size": batch, "clip": float(values.get("clip") or 1.0)}
    )
    nodes = parse_topology(str(getattr(cfg, "graph", None) or "complete:1")).n
    data: Any = node_data
    if nodes > 1:
        data = [_base(size, seed, i) for i in range(nodes)]
        data[canary_node or 0] = node_data
    torch.manual_seed(seed)  # the model's initial weights: public, from the seed
    user = UserObjects(data=user_data(data, n_classes=CLASSES), model=cnn_model())
    run = build_run(cfg, user=user, calibrated=calibrated is not None)
    if nodes > 1 and canary_node is None:
        from privdl.audit.gossip import gossip_view

        worst = gossip_view(run).canary
        if worst != 0:  # the threat model's canary node (DECOR: the accountant's worst node)
            return build_cnn_run(values, included, sampling_rate=sampling_rate, base=base,
                                 seed=seed, canary_node=worst, calibrated=run.cfg)  # fmt: skip
    return run


def cnn_canary_losses(run: Any, *, canaries: int, seed: int, key: int) -> np.ndarray:
    """``(canaries,)``: each canary's loss on the final model(s) the threat model's black-box
    adversary queries (the mean over them), after the run's own init and steps keyed by
    ``key``."""
    from privdl.audit.examples import black_box_nodes
    from privdl.audit.gossip import gossip_view
    from privdl.engine.losses import per_sample_loss
    from privdl.engine.threads import one_thread
    from privdl.loop import set_keys

    params = run.recipe.initial_params(run.cfg, run.task)
    set_keys(run, Keys.from_seed(key))
    with one_thread():
        state = run.algorithm.init(params, run.oracle, run.comm, keys=run.keys)
        for _ in range(int(run.cfg.steps)):  # the run's own steps
            state, _ = run.algorithm.step(state, run.oracle, run.comm)
    nodes = list(black_box_nodes(gossip_view(run))) if int(run.topology.n) > 1 else [0]
    final = {k: v[nodes] for k, v in state.params.items()}
    x, y = cnn_canaries(canaries, seed)
    first = next(iter(final.values()))
    with torch.no_grad():
        out = run.task.model.forward(final, x.to(first.dtype)[None].expand(len(nodes), *x.shape))
        loss = per_sample_loss(out, y[None].expand(len(nodes), -1), run.task.loss_name)
    return loss.mean(dim=0).double().numpy()
