"""Models with parameters stacked over nodes, and :func:`build_model` to make them by name.

Names and the papers they serve:

* ``linear`` — logistic / softmax regression, no hidden layer (``n_classes=1`` gives one logit for
  BCE). DECOR a9a (123 features + bias), PORTER a9a (d = 124 with the bias).
* ``mlp`` — fully connected network, ``hidden=(128,)`` and ReLU by default. DECOR MNIST
  784-128-10 (d = 101,770); PrivSGP-VR "2-layer" MNIST ``hidden=(64,)`` (d = 50,890); PORTER
  MNIST ``hidden=(64,), activation="sigmoid"`` (d = 50,890).
* ``cnn-mnist`` / ``cnn-fmnist`` — the Robust-HDP CNN (Table 5): conv 1->16 k5 p2, ReLU, pool 2,
  conv 16->32 k5 p2, ReLU, pool 2, flatten, fc 1568 -> 10 (p = 28,938; no activation on logits).
* ``resnet18-gn`` — ResNet-18 with GroupNorm(2) for CIFAR-10 (p = 11,181,642).
* ``resnet34-nonorm`` — the Robust-HDP code's norm-free ResNet-34 (p = 21,272,778).
* ``package.module:Name`` — your own ``torch.nn.Module`` (:class:`ModuleModel`).
"""

from __future__ import annotations

from typing import Any

from privdl.errors import ConfigError
from privdl.models.base import (
    Activation,
    AvgPool2d,
    Conv2d,
    Flatten,
    GroupNorm,
    Layer,
    Linear,
    MaxPool2d,
    SequentialModel,
    StackedModel,
)
from privdl.models.module import (
    ModuleModel,
    SequentialModuleModel,
    from_module,
    is_module_spec,
    model_from_spec,
)
from privdl.models.resnet import StackedResNet
from privdl.models.sequence import Conv1d, Embedding, LayerNorm, Reduce, Transpose

__all__ = [
    "MODEL_NAMES",
    "Activation",
    "AvgPool2d",
    "Conv1d",
    "Conv2d",
    "Embedding",
    "Flatten",
    "GroupNorm",
    "Layer",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "ModuleModel",
    "Reduce",
    "SequentialModel",
    "SequentialModuleModel",
    "StackedModel",
    "StackedResNet",
    "Transpose",
    "build_model",
    "from_module",
]

MODEL_NAMES = ("linear", "mlp", "cnn-mnist", "cnn-fmnist", "resnet18-gn", "resnet34-nonorm")


def _flat_dim(in_shape: tuple[int, ...]) -> int:
    d = 1
    for s in in_shape:
        d *= s
    return d


def _linear(in_shape, n_classes, *, bias: bool = True) -> SequentialModel:
    layers: list[tuple[str, Layer]] = []
    if len(in_shape) > 1:
        layers.append(("flatten", Flatten()))
    layers.append(("fc", Linear(_flat_dim(in_shape), n_classes, bias=bias)))
    return SequentialModel("linear", in_shape, layers)


def _mlp(
    in_shape, n_classes, *, hidden: tuple[int, ...] = (128,), activation: str = "relu"
) -> SequentialModel:
    layers: list[tuple[str, Layer]] = []
    if len(in_shape) > 1:
        layers.append(("flatten", Flatten()))
    width = _flat_dim(in_shape)
    for i, h in enumerate(hidden):
        layers.append((f"fc{i + 1}", Linear(width, int(h))))
        layers.append((f"act{i + 1}", Activation(activation)))
        width = int(h)
    layers.append((f"fc{len(hidden) + 1}", Linear(width, n_classes)))
    return SequentialModel("mlp", in_shape, layers)


def _cnn(name: str, in_shape, n_classes) -> SequentialModel:
    if len(in_shape) != 3:
        raise ConfigError(f"{name} needs in_shape (C, H, W), got {in_shape}")
    c, h, w = in_shape
    if h % 4 or w % 4:
        raise ConfigError(f"{name} needs H and W divisible by 4, got {in_shape}")
    layers: list[tuple[str, Layer]] = [
        ("conv1", Conv2d(c, 16, 5, padding=2)),
        ("relu1", Activation("relu")),
        ("pool1", MaxPool2d(2)),
        ("conv2", Conv2d(16, 32, 5, padding=2)),
        ("relu2", Activation("relu")),
        ("pool2", MaxPool2d(2)),
        ("flatten", Flatten()),
        ("fc", Linear(32 * (h // 4) * (w // 4), n_classes)),
    ]
    return SequentialModel(name, in_shape, layers)


def build_model(name: str, *, in_shape: tuple[int, ...], n_classes: int, **kw: Any) -> StackedModel:
    """Make a stacked model by name (see the module docstring for names and options).

    Options: ``linear``: ``bias``; ``mlp``: ``hidden``, ``activation``; ``resnet*``: ``width``
    (64 is the published network; smaller widths are for tests). A name of the form
    ``package.module:Name`` imports your own ``nn.Module`` (:mod:`privdl.models.module`).
    """
    in_shape = tuple(int(s) for s in in_shape)
    if not in_shape or any(s < 1 for s in in_shape):
        raise ConfigError(f"in_shape must be a non-empty tuple of positive sizes, got {in_shape}")
    if n_classes < 1:
        raise ConfigError(f"n_classes must be >= 1, got {n_classes}")
    if is_module_spec(name):
        if kw:
            raise ConfigError(f"model {name!r} takes no options, got {sorted(kw)}")
        model = model_from_spec(name, in_shape=in_shape)
        if model.out_shape != (n_classes,):
            raise ConfigError(
                f"model {name!r} outputs shape {model.out_shape} per sample; the task needs "
                f"({n_classes},) (one logit per class)"
            )
        return model
    try:
        if name == "linear":
            return _linear(in_shape, n_classes, **kw)
        if name == "mlp":
            return _mlp(in_shape, n_classes, **kw)
        if name in ("cnn-mnist", "cnn-fmnist"):
            if kw:
                raise TypeError(f"unexpected options {sorted(kw)}")
            return _cnn(name, in_shape, n_classes)
        if name in ("resnet18-gn", "resnet34-nonorm"):
            if len(in_shape) != 3:
                raise ConfigError(f"{name} needs in_shape (C, H, W), got {in_shape}")
            if name == "resnet18-gn":
                return StackedResNet(name, in_shape=in_shape, n_classes=n_classes, **kw)
            return StackedResNet(
                name,
                in_shape=in_shape,
                n_classes=n_classes,
                blocks=(3, 4, 6, 3),
                norm_groups=None,
                avgpool=False,
                **kw,
            )
    except TypeError as e:
        raise ConfigError(f"bad options for model {name!r}: {e}") from None
    raise ConfigError(
        f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)} or give your own "
        "nn.Module as package.module:Name"
    )
