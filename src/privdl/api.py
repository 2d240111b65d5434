"""The one-call facade: train your own model on your own data with any registered algorithm.

``privdl.train`` takes names (what ``privdl run`` takes) or objects, keyword-only::

    import privdl

    result = privdl.train(
        algorithm="decor", model=net, data=(X, y), graph="ring:4",
        clip=1.0, epsilon=5.0, delta=1e-5, steps=5, out="run",
    )
    result.model            # the averaged model, an nn.Module like ``net``
    result.node_models      # each node's model
    result.privacy          # epsilon with its accountant, delta, unit and threat model
    result.metrics          # the recorded rows

* ``model``: an ``nn.Module`` (every node starts from its weights), a function or class that makes
  one (called once under a torch seed drawn from the run's ``seed``: every node starts from that
  draw, and a resumed or launched run rebuilds it), or a model name;
* ``data``: ``(X, y)`` tensors or arrays, a ``torch.utils.data.Dataset`` or ``DataLoader`` (its
  dataset, and its batch size unless ``batch_size`` is given; privdl draws the minibatches
  itself, as the accountant assumes), or a list of per-node datasets (each node's own data);
  ``eval_data`` the same (default: the training data). The run's ``partition`` (iid,
  dirichlet:ALPHA, shards:K) splits data that is not per node;
* ``optimizer``: ``"sgd"``, ``"adam"``, ``"adamw"`` or options (``{"name": "sgd", "momentum":
  0.9}``), applied per node to the privatized gradient (gossip algorithms); the accountant is
  unchanged (post-processing);
* ``callbacks``: objects with ``on_evaluate(row)`` and/or ``on_checkpoint(path, step)`` (or a
  function, called as ``on_evaluate``) — log to TensorBoard, MLflow or anything else;
* ``algorithm="dpsgd"``: plain DP-SGD with a trusted aggregator (one node), labelled ``central``.

Every other keyword is a config key (``privdl run --help``); an unknown one is a
:class:`~privdl.errors.ConfigError`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import DataLoader

from privdl.config import CommonConfig, load_config_file
from privdl.data.custom import user_data
from privdl.errors import ConfigError
from privdl.loop import Trained, build_run, fit
from privdl.models.base import StackedModel
from privdl.models.export import average_module, node_modules
from privdl.records import RunRecords, write_record
from privdl.registry import make_config
from privdl.tasks import UserObjects
from privdl.tree import Tree

__all__ = ["TrainResult", "resume", "train"]

#: What a run made from Python objects records about them (checked on resume).
USER_FILE = "user.json"


@dataclass
class TrainResult:
    """A finished run: where its records are, its summary, and the trained models."""

    out: Path
    summary: dict[str, Any]
    config: CommonConfig
    #: every node's final parameters, node-stacked (a federated run: the server's, one row)
    params: Tree = field(repr=False)
    #: the network the nodes train (None for a task without one: least squares' ``x``)
    stacked_model: StackedModel | None = field(repr=False)

    def _network(self) -> StackedModel:
        if self.stacked_model is None:
            raise ConfigError(
                f"task {self.config.task!r} trains no network (its parameters are result.params)"
            )
        return self.stacked_model

    @property
    def model(self) -> nn.Module:
        """The averaged model (decentralized: the mean of the nodes'; federated: the server's)
        as an ``nn.Module`` in eval mode."""
        return average_module(self._network(), self.params)

    @property
    def node_models(self) -> list[nn.Module]:
        """Each node's model as an ``nn.Module``."""
        return node_modules(self._network(), self.params)

    @property
    def privacy(self) -> dict[str, Any] | None:
        """The privacy spent, labelled (epsilon, delta, accountant, neighbouring relation, unit,
        threat model); None for a non-private run."""
        return (self.summary.get("final") or {}).get("privacy")

    @property
    def records(self) -> RunRecords:
        return RunRecords(self.out)

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The recorded metrics rows (``metrics.jsonl``)."""
        return list(self.records.rows())

    def __getitem__(self, key: str) -> Any:
        """The summary's entries (``result["final"]``), as ``summary.json`` has them."""
        return self.summary[key]


class _Function:
    """A plain function given as a callback: called on every evaluation."""

    def __init__(self, fn: Any) -> None:
        self.on_evaluate = fn


def _callbacks(callbacks: Sequence[Any]) -> list[Any]:
    out = []
    for cb in callbacks:
        if hasattr(cb, "on_evaluate") or hasattr(cb, "on_checkpoint"):
            out.append(cb)
        elif callable(cb):
            out.append(_Function(cb))
        else:
            raise ConfigError(
                f"a callback has on_evaluate(row) and/or on_checkpoint(path, step), or is a "
                f"function; got {type(cb).__name__}"
            )
    return out


def _user_objects(
    values: dict[str, Any], model: Any, data: Any, eval_data: Any
) -> UserObjects | None:
    """Python objects out of ``values`` into :class:`UserObjects` (names stay in ``values``)."""
    obj = None
    if isinstance(model, str):
        values["model"] = model
    elif model is not None:
        obj = model
    udata = None
    if isinstance(data, DataLoader):  # Opacus-style: the loader's dataset and its batch size
        if "batch_size" not in values and data.batch_size is not None:
            values["batch_size"] = int(data.batch_size)
        data = data.dataset
    if isinstance(eval_data, DataLoader):
        eval_data = eval_data.dataset
    if data is not None:
        if values.get("task", "user") != "user":
            raise ConfigError(f"give task={values['task']!r} or data=..., not both")
        values["task"] = "user"
        udata = user_data(data, eval_data=eval_data)
    elif eval_data is not None:
        raise ConfigError("eval_data goes with data=... (your own training data)")
    if obj is None and udata is None:
        return None
    return UserObjects(data=udata, model=obj)


def _describe_model(model: Any) -> str:
    if isinstance(model, nn.Module):
        return f"module:{type(model).__module__}.{type(model).__qualname__}"
    return f"factory:{getattr(model, '__module__', '?')}.{getattr(model, '__qualname__', '?')}"


def _write_user(user: UserObjects | None) -> Any:
    def on_start(records: RunRecords, cfg: CommonConfig) -> None:
        if user is None:
            return
        write_record(
            records.dir / USER_FILE,
            {
                "data_fingerprint": user.data.fingerprint if user.data is not None else None,
                "model": _describe_model(user.model) if user.model is not None else None,
            },
        )

    return on_start


def _final_params(trained: Trained, out: Path, cfg: CommonConfig, user: Any) -> tuple[Tree, Any]:
    """Every node's final models and the stacked model (from the live run, or, for a run that
    was complete already, from its checkpoint)."""
    if trained.state is not None and trained.run is not None:
        run = trained.run
        return run.recipe.gather(run, trained.state)[0], getattr(run.task, "model", None)
    run = build_run(cfg, calibrated=True, user=user)
    ckpt = RunRecords(out).load_checkpoint()
    if ckpt is None:
        raise ConfigError(f"{out} holds no checkpoint to read the trained models from")
    model = getattr(run.task, "model", None)
    if model is None:
        return dict(ckpt["params"]), None
    shapes = model.param_shapes()
    params = {
        k: (v if v.dim() > len(shapes[k]) else v.unsqueeze(0)) for k, v in ckpt["params"].items()
    }
    return params, model


def _result(trained: Trained, out: Path, user: UserObjects | None) -> TrainResult:
    cfg = make_config(RunRecords(out).config(), saved=True)
    params, model = _final_params(trained, out, cfg, user)
    params = {k: v.detach().to("cpu") if v.device.type != "cpu" else v for k, v in params.items()}
    return TrainResult(Path(out), trained.summary, cfg, params, model)


def train(
    *,
    out: str | Path,
    config: str | Path | None = None,
    model: Any = None,
    data: Any = None,
    eval_data: Any = None,
    callbacks: Sequence[Any] = (),
    progress: bool | None = None,
    overwrite: bool = False,
    **options: Any,
) -> TrainResult:
    """Validate, calibrate, train and record one run (module docstring); returns its result.

    Args:
        out: the run's output directory (config, environment, append-only metrics, checkpoint,
            summary).
        config: an optional TOML file of options (a ``[run]`` table, or top-level keys); the
            keyword ``options`` override it.
        model, data, eval_data, callbacks: your own objects (module docstring).
        progress: a progress bar on stderr; ``None`` shows one only on a terminal.
        overwrite: replace an earlier run in ``out`` (otherwise that is refused).
        **options: config keys, e.g. ``algorithm``, ``task``, ``graph``, ``clip``, ``epsilon``,
            ``delta``, ``steps``, ``optimizer`` (the same as the CLI's flags).
    """
    values = load_config_file(config) if config is not None else {}
    values.update(options)
    user = _user_objects(values, model, data, eval_data)
    cfg = make_config(values)
    trained = fit(
        cfg, out, progress=progress, overwrite=overwrite, callbacks=_callbacks(callbacks),
        user=user, on_start=_write_user(user),
    )  # fmt: skip
    return _result(trained, Path(out), user)


def resume(
    out: str | Path,
    *,
    model: Any = None,
    data: Any = None,
    eval_data: Any = None,
    callbacks: Sequence[Any] = (),
    progress: bool | None = None,
) -> TrainResult:
    """Continue the run in ``out`` from its last checkpoint; returns its result. A run made
    from your own model or data needs them again (the data is checked by its fingerprint)."""
    records = RunRecords(out)
    saved = records.config()
    recorded = json.loads((records.dir / USER_FILE).read_text()) if (
        records.dir / USER_FILE
    ).is_file() else {}  # fmt: skip
    values = {"task": saved.get("task")}
    user = _user_objects(values, model, data, eval_data)
    if recorded.get("data_fingerprint") or saved.get("task") == "user":
        if user is None or user.data is None:
            raise ConfigError(f"{out} was trained on your own data: pass data= (and eval_data=)")
        if recorded.get("data_fingerprint"):
            user.data.check_fingerprint(recorded["data_fingerprint"])
    if recorded.get("model") and (user is None or user.model is None):
        raise ConfigError(f"{out} was trained on your own model: pass model= again")
    trained = fit(
        None, out, resume=True, progress=progress, callbacks=_callbacks(callbacks), user=user
    )
    return _result(trained, Path(out), user)
