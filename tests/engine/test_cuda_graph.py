"""GraphedGradients (privdl.engine.cuda_graph) against the eager node_gradients.

The oracle is the eager call on the same inputs: off CUDA the wrapper is that call; on CUDA
(``-m gpu``) the replayed graph runs the same kernels, so the values must agree bit for bit, also
after the inputs change between calls (the static buffers are refilled, not re-captured).
"""

from __future__ import annotations

import pytest
import torch

from privdl.engine import ClipSpec, node_gradients
from privdl.engine.cuda_graph import GraphedGradients, graphed_oracle
from privdl.models import build_model

CUDA = torch.cuda.is_available()


def _setup(name: str, device: str, n: int = 3, b: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    in_shape = (1, 28, 28) if name.startswith("cnn") else (12,)
    model = build_model(name, in_shape=in_shape, n_classes=4)
    params = {k: v.to(device) for k, v in model.init(n_nodes=n, generator=gen).items()}
    x = torch.randn(n, b, *in_shape, generator=gen).to(device)
    y = torch.randint(0, 4, (n, b), generator=gen).to(device)
    return model, params, x, y


def _assert_same(a, b) -> None:
    assert set(a.grads) == set(b.grads)
    for k in a.grads:
        assert torch.equal(a.grads[k], b.grads[k]), k
    assert torch.equal(a.loss, b.loss)


def test_off_cuda_it_is_the_eager_call() -> None:
    model, params, x, y = _setup("mlp", "cpu")
    clip = ClipSpec("per_sample", 0.5)
    g = GraphedGradients(model, loss="cross_entropy", clip=clip)
    _assert_same(
        g(params, x, y), node_gradients(model, params, x, y, loss="cross_entropy", clip=clip)
    )
    assert g.replays == 0 and g.failure is None


def test_graphed_oracle_keeps_one_wrapper_per_clipping() -> None:
    model, params, x, y = _setup("linear", "cpu")
    oracle = graphed_oracle(model, x, y, loss="cross_entropy")
    a = oracle(params, 0, clip=ClipSpec("per_sample", 1.0))
    oracle(params, 1, clip=ClipSpec("per_sample", 1.0))
    b = oracle(params, 2, clip=ClipSpec())
    assert len(oracle.graphs) == 2  # type: ignore[attr-defined]
    want = node_gradients(model, params, x, y, loss="cross_entropy", clip=ClipSpec())
    _assert_same(b, want)
    assert not torch.equal(a.grads["fc.weight"], b.grads["fc.weight"])  # clipping changed something


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize(
    ("name", "clip", "method"),
    [
        ("mlp", ClipSpec("per_sample", 0.5), "auto"),
        ("mlp", ClipSpec(), "auto"),
        ("mlp", ClipSpec("per_sample", 0.5), "vmap"),
        ("cnn-mnist", ClipSpec("per_sample", 1.0), "ghost"),
    ],
)
def test_replay_equals_eager_bit_for_bit_as_inputs_change(name, clip, method) -> None:
    model, params, x, y = _setup(name, "cuda")
    g = GraphedGradients(model, loss="cross_entropy", clip=clip, method=method)
    for step in range(4):
        gen = torch.Generator().manual_seed(100 + step)
        p = {k: v + 0.1 * torch.randn(v.shape, generator=gen).to(v) for k, v in params.items()}
        xs = x + torch.randn(x.shape, generator=gen).to(x)
        got = g(p, xs, y)
        want = node_gradients(model, p, xs, y, loss="cross_entropy", clip=clip, method=method)
        _assert_same(got, want)
    assert g.failure is None, g.failure
    assert g.replays == 4


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("sampling", ["without_replacement", "poisson"])
def test_task_oracle_on_cuda_replays_graphs_with_the_eager_values(sampling) -> None:
    """The run path (SupervisedTask.oracle inside DECOR steps): graphs on and off, bit for bit."""
    from privdl.algorithms.base import Keys, StepSize
    from privdl.algorithms.decor import Decor
    from privdl.comm.local import LocalCommunicator
    from privdl.tasks import SupervisedTask
    from privdl.topology import mixing_matrix, parse_graph

    topo = parse_graph("ring:4")
    comm = LocalCommunicator(mixing_matrix(topo, "decor"), device="cuda", dtype=torch.float32)
    decor = Decor(
        StepSize(0.1), edges=topo.edges, n_nodes=4, clip=ClipSpec("per_sample", 1.0),
        sigma_cdp=0.1, sigma_cor=0.5,
    )  # fmt: skip
    finals = []
    for graphs in (True, False):
        task = SupervisedTask(
            dataset_name="synthetic-cifar10", n_nodes=4, model_name="mlp", batch_size=8,
            sampling=sampling, device="cuda", cuda_graphs=graphs,
        )  # fmt: skip
        st = decor.init(task.init_params(seed=1), task.oracle, comm, keys=Keys.from_seed(1))
        for _ in range(4):
            st, _ = decor.step(st, task.oracle, comm)
        finals.append(st.params)
        if graphs:
            (g,) = task._graphs.values()
            assert g.failure is None and g.replays >= 1, g.failure
    for k in finals[0]:
        assert torch.equal(finals[0][k], finals[1][k]), k
