"""Known implementation mistakes, switched on one at a time for the audit to catch (issue 31).

Each context manager replaces one function of privdl's code path with a buggy copy, exactly where
a real bug would sit (the names the algorithm and recipe modules look up at call time), and
restores it on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from unittest import mock

import torch

import privdl.algorithms.decor as decor_module
import privdl.algorithms.privsgp as privsgp_module
import privdl.recipes.gossip as gossip_recipe
import privdl.tasks as tasks
from privdl.algorithms.federated import FederatedRounds
from privdl.data.batching import BatchIndex, sample_batches
from privdl.engine.grads import ClipSpec, node_gradients
from privdl.mechanisms.correlated import correlated_noise, decor_noise, independent_noise
from privdl.rng import step_generator


@contextlib.contextmanager
def reused_correlated_noise() -> Iterator[None]:
    """The DECOR reference code's bug: the pairwise noise v_ij is drawn once and reused at every
    step (the stream counter of the correlated part stays 0); the independent noise is fresh."""

    def buggy(edge_keys, edges, n_nodes, node_keys, counter, size, *, sigma_cor, sigma_cdp,
              nodes=None, prefetch=False, design=None, **kw):  # fmt: skip
        assert design is None, "the planted bug reuses DECOR's scalar noise"
        cor = correlated_noise(edge_keys, edges, n_nodes, 0, size, sigma_cor=sigma_cor,
                               nodes=nodes, **kw)  # fmt: skip
        return cor + independent_noise(node_keys, counter, size, sigma=sigma_cdp, **kw)

    with mock.patch.object(decor_module, "decor_noise", buggy):
        yield


@contextlib.contextmanager
def noise_scaled_per_node(factors: Sequence[float]) -> Iterator[None]:
    """Node i's noise multiplied by ``factors[i]``: by its mixing weight W_ii (noise scaled by the
    mixing weights instead of added in full before mixing), or by 0 (one node's noise dropped)."""
    scale = torch.tensor(list(factors), dtype=torch.float64)

    def buggy(*args, **kwargs):
        out = decor_noise(*args, **kwargs)
        return out * scale.to(out.dtype)[:, None]

    with mock.patch.object(decor_module, "decor_noise", buggy):
        yield


@contextlib.contextmanager
def accountant_without_composition() -> Iterator[None]:
    """The run's accountant reports one step's epsilon whatever the number of steps."""
    spent = gossip_recipe.spent

    def buggy(*args, **kwargs):
        at = spent(*args, **kwargs)
        return lambda t: at(min(t, 1))

    with mock.patch.object(gossip_recipe, "spent", buggy):
        yield


@contextlib.contextmanager
def clipping_after_averaging() -> Iterator[None]:
    """Per-example clipping asked for, but the minibatch's mean gradient clipped instead."""

    def buggy(model, params, x, y, *, clip, **kwargs):
        if clip.mode == "per_sample":
            clip = ClipSpec(mode="batch_mean", threshold=clip.threshold, kind=clip.kind)
        return node_gradients(model, params, x, y, clip=clip, **kwargs)

    with mock.patch.object(tasks, "node_gradients", buggy):
        yield


@contextlib.contextmanager
def one_poisson_draw_for_every_step() -> Iterator[None]:
    """``sampling="poisson"`` whose generator is seeded with a constant instead of the step: one
    Poisson draw, reused at every step (an example is in every minibatch or in none), while the
    accountant assumes a fresh draw per step."""

    def buggy(counts, batch_size, *, generator, scheme="without_replacement", m_max=None):
        if scheme == "poisson":
            generator = torch.Generator(device=generator.device).manual_seed(12345)
        return sample_batches(counts, batch_size, generator=generator, scheme=scheme,
                              m_max=m_max)  # fmt: skip

    with mock.patch.object(tasks, "sample_batches", buggy):
        yield


@contextlib.contextmanager
def batches_in_data_order() -> Iterator[None]:
    """``sampling="poisson"`` served by a loader that walks the data in order: the fixed-size
    batch of step ``t`` is rows ``[t b, (t + 1) b)`` modulo the local size (no shuffling, no
    Poisson draw), while the accountant amplifies by Poisson sampling at rate ``b / m``. The
    step reaches the sampler as it does in a real loader, through the step's generator."""
    step: dict[str, int] = {}

    def generator(seed, purpose, t, device="cpu"):
        step[purpose] = int(t)
        return step_generator(seed, purpose, t, device)

    def buggy(counts, batch_size, *, generator, scheme="without_replacement", m_max=None):
        if scheme != "poisson":
            return sample_batches(counts, batch_size, generator=generator, scheme=scheme,
                                  m_max=m_max)  # fmt: skip
        counts = torch.as_tensor(counts, dtype=torch.int64)
        start = step["batches"] * batch_size
        index = (start + torch.arange(batch_size)[None, :]) % counts[:, None]
        return BatchIndex(index, torch.ones_like(index, dtype=torch.bool))

    with (mock.patch.object(tasks, "step_generator", generator),
          mock.patch.object(tasks, "sample_batches", buggy)):  # fmt: skip
        yield


@contextlib.contextmanager
def shuffled_batches_per_epoch() -> Iterator[None]:
    """``sampling="poisson"`` served by a loader that shuffles once per epoch: a fresh secret
    permutation of the local data each epoch (seeded by the run's sampling seed and the epoch),
    cut into fixed-size batches of ``b`` rows, so every example joins exactly one batch per
    epoch; the accountant still amplifies by Poisson sampling at ``b / m``."""
    step: dict[str, tuple[int, int]] = {}

    def generator(seed, purpose, t, device="cpu"):
        step[purpose] = (int(seed), int(t))
        return step_generator(seed, purpose, t, device)

    def buggy(counts, batch_size, *, generator, scheme="without_replacement", m_max=None):
        if scheme != "poisson":
            return sample_batches(counts, batch_size, generator=generator, scheme=scheme,
                                  m_max=m_max)  # fmt: skip
        seed, t = step["batches"]
        counts = torch.as_tensor(counts, dtype=torch.int64)
        rows = []
        for count in counts.tolist():  # setup per node (one node in the audits)
            per_epoch = max(1, count // batch_size)
            perm = torch.randperm(count, generator=step_generator(seed, "shuffle", t // per_epoch))
            at = (t % per_epoch) * batch_size
            rows.append(perm[at : at + batch_size])
        index = torch.stack(rows)
        return BatchIndex(index, torch.ones_like(index, dtype=torch.bool))

    with (mock.patch.object(tasks, "step_generator", generator),
          mock.patch.object(tasks, "sample_batches", buggy)):  # fmt: skip
        yield


@contextlib.contextmanager
def privsgp_node_noise_dropped(node: int, nodes: int) -> Iterator[None]:
    """PrivSGP(-VR) (line 5 of Algorithm 1) without node ``node``'s noise: the rows ``node``,
    ``node + nodes``, ... of the noise zeroed (an audit runs copies of the ``nodes``-node
    network one after the other)."""

    def buggy(*args, **kwargs):
        out = independent_noise(*args, **kwargs)
        keep = (torch.arange(out.shape[0], device=out.device) % nodes != node).to(out.dtype)
        return out * keep[:, None]

    with mock.patch.object(privsgp_module, "independent_noise", buggy):
        yield


@contextlib.contextmanager
def privsgp_block_clipped_after_averaging() -> Iterator[None]:
    """PrivSGP(-VR)'s table entries (blocks of samples) clipped as a block mean, not per sample:
    one example of a block of B then moves its entry by up to C instead of C / B."""

    def buggy(model, params, x, y, *, clip, **kwargs):
        if clip.mode == "per_sample":
            clip = ClipSpec(mode="batch_mean", threshold=clip.threshold, kind=clip.kind)
        return node_gradients(model, params, x, y, clip=clip, **kwargs)

    with mock.patch.object(privsgp_module, "node_gradients", buggy):
        yield


@contextlib.contextmanager
def client_noise_scaled(factor: float, client: int = 0) -> Iterator[None]:
    """A federated client's local DP-SGD (Robust-HDP Eq. 1) with its noise multiplied by
    ``factor`` (0: dropped) in its local training, while its accountant still counts the
    calibrated noise multiplier."""
    local_updates = FederatedRounds.local_updates

    def buggy(self, *args, **kwargs):
        z = list(self.noise_multipliers)
        z[client] *= factor
        return local_updates(dataclasses.replace(self, noise_multipliers=tuple(z)), *args,
                             **kwargs)  # fmt: skip

    with mock.patch.object(FederatedRounds, "local_updates", buggy):
        yield
