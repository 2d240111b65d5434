"""Example-level audits of DP-SGD: canary *examples* in Poisson-sampled minibatches, through the
task's own data path (sampling, per-example gradients, per-example clipping, the expected batch
size as denominator, Gaussian noise; Abadi et al. 2016, Algorithm 1).

The run is DP-SGD on the caller's kind of data (``task="user"``: a dataset and an ``nn.Module``),
built as ``privdl.train`` builds it. The data and model are chosen so that every trial is one
coordinate and the trials are independent:

* the model is a bias-free linear layer ``f(x) = w . x`` over ``B`` inputs with the logistic
  loss (binary labels), started at ``w = 0``;
* trial ``k`` has a canary example ``x = Y e_k`` with label 1 in the dataset (``present``) or no
  example at all (``absent``): add/remove, the relation Poisson sampling is accounted under;
* the canary's gradient ``(sigmoid(Y w_k) - 1) Y e_k`` lies on coordinate ``k`` only and, with
  ``Y = 100 C`` and a small step size, its norm stays far above ``C``: the task clips it to exactly
  ``C`` (the sensitivity the accountant assumes);
* each example joins each minibatch independently (Poisson), and the noise is independent per
  coordinate, so the ``B`` coordinates are ``B`` independent trials of one run.

The adversary is the trusted aggregator's audience (threat model ``central``): it sees the released
model after every step; its view of trial ``k`` is the increments of ``w_k``.

The gossip family with local noise (DECOR, Allouah et al. 2024, Algorithm 1, and its LDP
baseline) is audited the same way at example level: the canary examples are node 0's data
(absent ones all-zero slots), every other node holds as many all-zero examples, and the
adversary (eavesdropper, or LDP's) sees every message ``x_i^{t+1/2}`` on the wire, every step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from privdl.algorithms.base import Keys
from privdl.audit.gossip import MAX_CELLS, _Recording
from privdl.comm.base import Communicator
from privdl.engine.threads import one_thread
from privdl.errors import ConfigError

__all__ = ["build_example_run", "canary_data", "canary_losses", "example_views"]

#: The canary input's scale, in units of the clipping threshold (keeps its gradient clipped).
CANARY_SCALE = 100.0


def canary_data(
    present: np.ndarray, clip: float, *, fillers: bool = False, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One example ``Y e_k`` (label 1) for every present trial ``k``. ``fillers``: an all-zero
    example (zero gradient) in place of every absent one, so the dataset keeps ``len(present)``
    examples whatever is present (one-run audits: the sampling rate and the denominator must not
    depend on which canaries are in; with Poisson sampling and a fixed denominator a
    zero-gradient example changes nothing, so this is add/remove). ``rows`` (with ``fillers``):
    the dataset's size, the canary slots first and all-zero examples after them (the canaries at
    a known position of the data order)."""
    where = np.flatnonzero(present)
    total = len(present) if rows is None else int(rows)
    if rows is not None and (not fillers or total < len(present)):
        raise ConfigError("a padded canary dataset keeps a slot per trial (fillers) first")
    x = torch.zeros((total if fillers else len(where), len(present)), dtype=torch.float32)
    at = where if fillers else np.arange(len(where))
    x[torch.as_tensor(at), torch.as_tensor(where)] = CANARY_SCALE * clip
    return x, torch.ones(x.shape[0], dtype=torch.int64)


def build_example_run(
    values: dict[str, Any],
    present: np.ndarray,
    *,
    sampling_rate: float,
    calibrated: Any = None,
    fillers: bool = False,
    known_position: bool = False,
    canary_node: int | None = None,
) -> Any:
    """The DP-SGD run of one batch of trials: the canary examples of ``present`` as its data,
    the expected batch size ``sampling_rate`` times their number (the accounted rate is what
    that rounds to), calibrated to ``values``' epsilon as a run would be (``calibrated``: an
    earlier batch's resolved config of the same size, reused as it is). ``fillers``: see
    :func:`canary_data` (the dataset and batch size then count every slot).

    ``known_position``: the canary slots are the first ``B = len(present)`` rows of a dataset of
    ``round(B / sampling_rate)`` rows, the rest all-zero examples, and the expected batch size is
    ``B``. Under Poisson sampling with the fixed denominator this is the same mechanism (a
    zero-gradient example changes nothing), but an adversary who knows the data order knows
    where the canaries sit: a sampler that walks the data in order (fixed-size batches, no
    shuffling) puts every canary in the same steps, once per pass (module docstring).

    A gossip run (several nodes) holds the canaries at ``canary_node`` (default: the node the
    threat model's adversary is audited against, :func:`privdl.audit.gossip.gossip_view`; node
    0 but for DECOR's curious and colluding views), all-zero examples at every other node."""
    from privdl.data.custom import user_data
    from privdl.loop import build_run  # the loop imports the registry, which imports recipes
    from privdl.registry import make_config
    from privdl.tasks import UserObjects
    from privdl.topology import parse_topology

    m = len(present) if fillers or known_position else int(np.sum(present))
    if m < 1 or not 0 < sampling_rate <= 1:
        raise ConfigError("an example-level audit needs canaries and a sampling rate in (0, 1]")
    clip = float(values.get("clip") or 1.0)
    rows = max(m, round(m / sampling_rate)) if known_position else None
    x, y = canary_data(present, clip, fillers=fillers or known_position, rows=rows)
    batch = m if known_position else max(1, round(sampling_rate * m))
    cfg = calibrated or make_config({**values, "task": "user", "batch_size": batch, "clip": clip})
    model = nn.Linear(len(present), 1, bias=False)
    nn.init.zeros_(model.weight)
    nodes = parse_topology(str(getattr(cfg, "graph", None) or "complete:1")).n
    data: Any = (x, y)
    if nodes > 1:  # gossip: the canaries at one node, every other node all-zero examples
        if not fillers:
            raise ConfigError("a gossip example-level audit keeps a slot per trial (fillers)")
        data = [(torch.zeros_like(x), y)] * nodes
        data[canary_node or 0] = (x, y)
    elif known_position:  # the data as the node's own dataset (a list of one), in its order
        data = [(x, y)]
    user = UserObjects(data=user_data(data, n_classes=2), model=model)
    run = build_run(cfg, user=user, calibrated=calibrated is not None)
    if nodes > 1 and canary_node is None:
        from privdl.audit.gossip import gossip_view

        worst = gossip_view(run).canary
        if worst != 0:  # the threat model's canary node (DECOR: the accountant's worst node)
            return build_example_run(values, present, sampling_rate=sampling_rate,
                                     calibrated=run.cfg, fillers=fillers, canary_node=worst)  # fmt: skip
    return run


def example_views(run: Any, *, seed: int) -> np.ndarray:
    """``(B, steps)`` increments of each trial's coordinate of the released model, over the
    run's steps (its own oracle: sampling, clipping and noise as implemented). A gossip run
    (several nodes): what its threat model's adversary sees, every step (:func:`_wire`)."""
    if int(run.topology.n) > 1:
        return _wire(run, seed=seed)
    model = torch.stack([r.reshape(-1).double() for r in _released_models(run, seed=seed)])
    return torch.diff(model, dim=0).T.numpy()  # (steps + 1, B) -> (B, steps)


def _wire(run: Any, *, seed: int) -> np.ndarray:
    """What the threat model's adversary sees of a gossip run, every step
    (:func:`privdl.audit.gossip.gossip_view`): every message ``x_i^{t+1/2}`` (eavesdropper,
    LDP), a curious node's or colluders' incoming messages and edge noise, the released model
    (CDP), the canary node's compressed surrogates (PORTER-DP): ``(B, features)``."""
    from privdl.audit.gossip import gossip_view

    views, _ = _observed(run, seed=seed, view=gossip_view(run))
    return views


def _observed(run: Any, *, seed: int, view: Any) -> tuple[np.ndarray, Any]:
    """The run's own init and steps on its own data path (keys from ``seed``): ``view``'s
    observations and the final state."""
    from privdl.audit.gossip import observe
    from privdl.loop import set_keys

    params = run.recipe.initial_params(run.cfg, run.task)
    set_keys(run, Keys.from_seed(seed))
    with one_thread():
        return observe(run, view, run.oracle, params, keys=run.keys)


def gossip_canary_losses(run: Any, *, seed: int) -> np.ndarray:
    """``(B, nodes)``: the task's loss of every canary example on the *final* models of the
    nodes a black-box adversary of the run's threat model holds or is given
    (:func:`black_box_nodes`), nothing of the training (a gossip run, input canaries)."""
    from privdl.audit.gossip import gossip_view
    from privdl.engine.losses import per_sample_loss

    view = gossip_view(run)
    nodes = list(black_box_nodes(view))
    _, state = _observed(run, seed=seed, view=replace(view, message_rows=(), secret_edges=()))
    (name,) = state.params.keys()
    final = state.params[name][nodes]
    size = int(final[0].numel())
    x, y = canary_data(np.ones(size, dtype=bool), float(run.cfg.clip))
    with torch.no_grad():
        out = run.task.model.forward(
            {name: final}, x.to(final.dtype)[None].expand(len(nodes), -1, -1)
        )
        loss = per_sample_loss(out, y[None].expand(len(nodes), -1), run.task.loss_name)
    return loss.T.double().numpy()


def black_box_nodes(view: Any) -> tuple[int, ...]:
    """Whose final model a black-box adversary queries: the colluders' own (curious,
    collusion:Q), the released model (central: node 0 after exact averaging), the canary node's
    (PORTER-DP), every node's trained model (eavesdropper, LDP: what the run releases)."""
    if view.colluders:
        return tuple(view.colluders)
    if view.released:
        return (0,)
    return tuple(view.message_rows)


def canary_losses(run: Any, *, seed: int) -> np.ndarray:
    """``(B,)``: the task's loss of every canary example (present or not) on the *final* model
    only (a black-box adversary: it queries the released model, nothing of its training)."""
    from privdl.engine.losses import per_sample_loss

    final = _released_models(run, seed=seed)[-1]
    (name,) = run.recipe.initial_params(run.cfg, run.task).keys()
    size = final.numel()
    x, y = canary_data(np.ones(size, dtype=bool), float(run.cfg.clip))
    with torch.no_grad():
        out = run.task.model.forward({name: final}, x.to(final.dtype)[None])
        loss = per_sample_loss(out, y[None], run.task.loss_name)
    return loss[0].double().numpy()


def _released_models(run: Any, *, seed: int) -> list[torch.Tensor]:
    """The released model (node 0's copy of the run's one weight) at the start and after every
    step: the run's own init and steps, keyed by ``seed``."""
    from privdl.loop import set_keys

    steps = int(run.cfg.steps)
    params = run.recipe.initial_params(run.cfg, run.task)
    size = sum(int(v[0].numel()) for v in params.values())
    if size * steps > MAX_CELLS:
        raise ConfigError(f"{size} trials x {steps} steps is too large for one audit")
    set_keys(run, Keys.from_seed(seed))  # the sampling seed of the minibatches, and the noise
    comm = _Recording(run.comm)
    with one_thread():
        state = run.algorithm.init(params, run.oracle, cast(Communicator, comm), keys=run.keys)
        released = [next(iter(params.values()))[:1].clone()]
        for _ in range(steps):  # the run's own steps (each vectorised over all trials)
            state, _ = run.algorithm.step(state, run.oracle, cast(Communicator, comm))
            _, received = comm.take()
            released.append(received[-1][:1].clone())
    return released
