"""Communication compressors for compressed gossip (PORTER, Li & Chi; BEER; CHOCO-SGD).

Every compressor is a small frozen dataclass with a pure ``__call__(x, *, generator)`` that acts on
a node-leading tensor ``x`` of shape ``(n, P)``: each row is one agent's message and is compressed
independently, with independent randomness per row and per call (one vectorised draw, no loop over
rows). Calling the same compressor twice, e.g. for PORTER's two channels (Algorithm 1, steps (11)
and (13)), gives independent masks because the generator advances.

Naming (PORTER, Definition 3): ``C`` is a *rho-compression operator* when

    E ||C(x) - x||^2 <= (1 - rho) ||x||^2      for all x,   rho in (0, 1].

PORTER's ``alpha`` is the graph MIXING RATE, never a compressor parameter; here the compressor
parameter is always ``contraction(P)`` (= rho) and, for unbiased compressors, ``omega(P)`` with
``E C(x) = x`` and ``E ||C(x) - x||^2 <= omega ||x||^2``. An unbiased compressor becomes a
rho-compression operator with rho = 1/(1+omega) after scaling by 1/(1+omega) (``.contractive()``).

Bit costs (``bits(P)``) are for ONE message of one agent (one row) and state their encoding:

* values are ``value_bits`` wide (32 by default; the PORTER/SoteriaFL authors count 64);
* random sparsifiers either share a seed (``index_encoding="seed"``: the receiver regenerates the
  mask; cost k values + ``seed_bits``) or send indices (``"indices"``: k * ceil(log2 P) bits);
  the authors' convention "k * 64" is ``value_bits=64, seed_bits=0``;
* top-k must send its indices (``"indices"``) or a P-bit mask (``"bitmap"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from privdl.errors import ConfigError

__all__ = [
    "Compressor",
    "Identity",
    "RandomK",
    "UnbiasedRandomK",
    "TopK",
    "QSGD",
    "ScaledCompressor",
    "parse_compressor",
    "num_kept",
]


@runtime_checkable
class Compressor(Protocol):
    """A compressor acting row-wise on ``(n, P)`` tensors."""

    @property
    def unbiased(self) -> bool: ...  # read-only: the compressors are frozen dataclasses

    def __call__(self, x: Tensor, *, generator: torch.Generator) -> Tensor: ...

    def contraction(self, P: int) -> float: ...

    def bits(self, P: int) -> int: ...


def _check_2d(x: Tensor) -> None:
    if x.ndim != 2:
        raise ConfigError(f"compressors act on (n, P) tensors, got shape {tuple(x.shape)}")


def num_kept(P: int, *, k: int | None, fraction: float | None) -> int:
    """Number of kept coordinates: ``k`` if given, else ``floor(fraction * P)`` (at least 1).

    PORTER's experiments use ``k = floor(d / 20)`` (Section 5), i.e. ``fraction = 0.05``.
    """
    if P < 1:
        raise ConfigError(f"message dimension P must be >= 1, got {P}")
    if k is not None:
        if k < 1 or k > P:
            raise ConfigError(f"k must be in [1, P={P}], got {k}")
        return int(k)
    assert fraction is not None
    # round() guards against 0.29 * 100 = 28.999999999999996
    return max(1, min(P, math.floor(round(fraction * P, 9))))


def _validate_k(k: int | None, fraction: float | None) -> None:
    if (k is None) == (fraction is None):
        raise ConfigError("give exactly one of k (count) or fraction (share of coordinates)")
    if k is not None and k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if fraction is not None and not (0.0 < fraction <= 1.0):
        raise ConfigError(f"fraction must be in (0, 1], got {fraction}")


def _random_k_mask(x: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Row-wise uniformly random k-subsets without replacement, as a 0/1 mask like ``x``."""
    keys = torch.rand(x.shape, generator=generator, device=x.device)
    idx = torch.topk(keys, k, dim=1, sorted=False).indices
    mask = torch.zeros_like(x)
    mask.scatter_(1, idx, 1.0)
    return mask


def _sparse_bits(P: int, k: int, *, value_bits: int, index_encoding: str, seed_bits: int) -> int:
    if index_encoding == "seed":
        return k * value_bits + seed_bits
    if index_encoding == "indices":
        return k * (value_bits + max(1, math.ceil(math.log2(P))))
    if index_encoding == "bitmap":
        return k * value_bits + P
    raise ConfigError(f"unknown index_encoding {index_encoding!r}")


@dataclass(frozen=True)
class Identity:
    """No compression (rho = 1, omega = 0). Sends P values of ``value_bits`` bits."""

    value_bits: int = 32
    unbiased: bool = True

    def __call__(self, x: Tensor, *, generator: torch.Generator) -> Tensor:
        _check_2d(x)
        return x.clone()

    def contraction(self, P: int) -> float:
        return 1.0

    def omega(self, P: int) -> float:
        return 0.0

    def bits(self, P: int) -> int:
        return P * self.value_bits


@dataclass(frozen=True)
class RandomK:
    """Biased random sparsification without rescaling (PORTER Example 1; used in its Section 5).

    ``C(x) = m ⊙ x`` with ``m`` a uniformly random k-subset mask (``bernoulli=False``, exactly k
    nonzeros) or i.i.d. Bernoulli(k/P) entries (``bernoulli=True``). Either way
    ``E||C(x) - x||^2 = (1 - k/P)||x||^2`` exactly, so rho = k/P. Kept entries are NOT rescaled
    (unlike the authors' NDA helper, which zeroes k coordinates instead of keeping them).

    Bits: with a shared seed, k values + ``seed_bits`` (the Bernoulli variant sends its
    random count of values, accounted at the expected k); with ``"indices"``,
    k * (value_bits + ceil(log2 P)).
    """

    k: int | None = None
    fraction: float | None = None
    bernoulli: bool = False
    value_bits: int = 32
    index_encoding: Literal["seed", "indices"] = "seed"
    seed_bits: int = 64
    unbiased: bool = False

    def __post_init__(self) -> None:
        _validate_k(self.k, self.fraction)

    def num_kept(self, P: int) -> int:
        return num_kept(P, k=self.k, fraction=self.fraction)

    def __call__(self, x: Tensor, *, generator: torch.Generator) -> Tensor:
        _check_2d(x)
        k = self.num_kept(x.shape[1])
        if self.bernoulli:
            u = torch.rand(x.shape, generator=generator, device=x.device)
            return torch.where(u < k / x.shape[1], x, torch.zeros_like(x))
        return x * _random_k_mask(x, k, generator)

    def contraction(self, P: int) -> float:
        return self.num_kept(P) / P

    def bits(self, P: int) -> int:
        return _sparse_bits(
            P,
            self.num_kept(P),
            value_bits=self.value_bits,
            index_encoding=self.index_encoding,
            seed_bits=self.seed_bits,
        )


@dataclass(frozen=True)
class UnbiasedRandomK:
    """Unbiased random-k: ``C(x) = (P/k) m ⊙ x`` with a uniformly random k-subset mask ``m``.

    ``E C(x) = x`` and ``E||C(x) - x||^2 = omega ||x||^2`` with omega = P/k - 1, which exceeds
    ``||x||^2`` when k < P/2: the raw operator is NOT a rho-compression operator. Its scaled
    form ``C/(1+omega)`` (``.contractive()``), which equals the biased :class:`RandomK`, is, with
    rho = 1/(1+omega) = k/P; ``contraction(P)`` reports that rho (PORTER Section 3.2 remark).
    """

    k: int | None = None
    fraction: float | None = None
    value_bits: int = 32
    index_encoding: Literal["seed", "indices"] = "seed"
    seed_bits: int = 64
    unbiased: bool = True

    def __post_init__(self) -> None:
        _validate_k(self.k, self.fraction)

    def num_kept(self, P: int) -> int:
        return num_kept(P, k=self.k, fraction=self.fraction)

    def __call__(self, x: Tensor, *, generator: torch.Generator) -> Tensor:
        _check_2d(x)
        P = x.shape[1]
        k = self.num_kept(P)
        return x * _random_k_mask(x, k, generator) * (P / k)

    def omega(self, P: int) -> float:
        return P / self.num_kept(P) - 1.0

    def contraction(self, P: int) -> float:
        """rho of the scaled operator ``C/(1+omega)``, i.e. 1/(1+omega) = k/P."""
        return 1.0 / (1.0 + self.omega(P))

    def contractive(self) -> ScaledCompressor:
        return ScaledCompressor(base=self)

    def bits(self, P: int) -> int:
        return _sparse_bits(
            P,
            self.num_kept(P),
            value_bits=self.value_bits,
            index_encoding=self.index_encoding,
            seed_bits=self.seed_bits,
        )


@dataclass(frozen=True)
class TopK:
    """Top-k by absolute value (PORTER Example 2): keep the k largest ``|x_j|`` of each row.

    Deterministic; ``||C(x) - x||^2 <= (1 - k/P)||x||^2`` for every x, so rho = k/P. Ties are
    broken by ``torch.topk``. (The authors' NDA helper ranks signed values; this one does not.)
    Bits: k values + k indices of ceil(log2 P) bits (``"indices"``) or a P-bit mask
    (``"bitmap"``).
    """

    k: int | None = None
    fraction: float | None = None
    value_bits: int = 32
    index_encoding: Literal["indices", "bitmap"] = "indices"
    unbiased: bool = False

    def __post_init__(self) -> None:
        _validate_k(self.k, self.fraction)

    def num_kept(self, P: int) -> int:
        return num_kept(P, k=self.k, fraction=self.fraction)

    def __call__(self, x: Tensor, *, generator: torch.Generator) -> Tensor:
        _check_2d(x)
        k = self.num_kept(x.shape[1])
        idx = torch.topk(x.abs(), k, dim=1, sorted=False).indices
        out = torch.zeros_like(x)
        out.scatter_(1, idx, torch.gather(x, 1, idx))
        return out

    def contraction(self, P: int) -> float:
        return self.num_kept(P) / P

    def bits(self, P: int) -> int:
        return _sparse_bits(
            P,
            self.num_kept(P),
            value_bits=self.value_bits,
            index_encoding=self.index_encoding,
            seed_bits=0,
        )


@dataclass(frozen=True)
class QSGD:
    """Stochastic quantisation with s levels (Alistarh et al. 2017, QSGD).

    ``Q(x)_j = ||x|| sign(x_j) xi_j`` with ``xi_j in {l/s, (l+1)/s}``, ``l = floor(s |x_j|/||x||)``,
    rounded up with probability ``s |x_j|/||x|| - l``. Unbiased, with
    ``E||Q(x) - x||^2 <= omega ||x||^2``, omega = min(P/s^2, sqrt(P)/s) (QSGD Lemma 3.1).
    ``contraction(P)`` = 1/(1+omega) is the rho of the scaled operator ``Q/(1+omega)``
    (``.contractive()``); the raw Q is not a rho-compression operator when omega >= 1.

    Bits (fixed-width encoding, no Elias coding): one float norm of ``value_bits`` plus, per
    coordinate, one sign bit and ceil(log2(s+1)) bits for the level.
    """

    levels: int = 16
    value_bits: int = 32
    unbiased: bool = True

    def __post_init__(self) -> None:
        if self.levels < 1:
            raise ConfigError(f"QSGD needs levels >= 1, got {self.levels}")

    def __call__(self, x: Tensor, *, generator: torch.Generator) -> Tensor:
        _check_2d(x)
        s = self.levels
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        safe = torch.where(norm > 0, norm, torch.ones_like(norm))
        scaled = x.abs() / safe * s
        low = torch.floor(scaled)
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        level = low + (u < (scaled - low)).to(x.dtype)
        return torch.sign(x) * norm * level / s

    def omega(self, P: int) -> float:
        s = self.levels
        return min(P / s**2, math.sqrt(P) / s)

    def contraction(self, P: int) -> float:
        return 1.0 / (1.0 + self.omega(P))

    def contractive(self) -> ScaledCompressor:
        return ScaledCompressor(base=self)

    def bits(self, P: int) -> int:
        return self.value_bits + P * (1 + math.ceil(math.log2(self.levels + 1)))


@dataclass(frozen=True)
class ScaledCompressor:
    """``C(x)/(1+omega)`` for an unbiased ``C`` with variance omega: a rho-compression operator
    with rho = 1/(1+omega) (biased). Same message as ``base``, so the same bits."""

    base: UnbiasedRandomK | QSGD
    unbiased: bool = False

    def __call__(self, x: Tensor, *, generator: torch.Generator) -> Tensor:
        return self.base(x, generator=generator) / (1.0 + self.base.omega(x.shape[1]))

    def contraction(self, P: int) -> float:
        return 1.0 / (1.0 + self.base.omega(P))

    def bits(self, P: int) -> int:
        return self.base.bits(P)


def parse_compressor(spec: str, *, value_bits: int = 32) -> Compressor:
    """Build a compressor from a CLI/config spec.

    Forms: ``"none"`` / ``"identity"``; ``"randk:0.05"`` (biased random-k, share of coordinates)
    or ``"randk:6"`` (absolute k; alias ``"random:..."``); ``"urandk:..."`` (unbiased, P/k-scaled random-k);
    ``"bernk:0.05"`` (Bernoulli random sparsification); ``"topk:0.1"``; ``"qsgd:16"`` (levels).
    A number with a decimal point is a fraction in (0, 1]; an integer is a count.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"compressor spec must be a non-empty string, got {spec!r}")
    name, sep, arg = spec.strip().lower().partition(":")
    name = "randk" if name == "random" else name  # the paper's "random_k" wording
    if name in ("none", "identity"):
        if sep:
            raise ConfigError(f"compressor {name!r} takes no argument, got {spec!r}")
        return Identity(value_bits=value_bits)
    if not sep or not arg:
        raise ConfigError(f"compressor spec {spec!r} needs an argument, e.g. 'randk:0.05'")
    if name == "qsgd":
        try:
            levels = int(arg)
        except ValueError:
            raise ConfigError(f"qsgd levels must be an integer >= 1, got {arg!r}") from None
        return QSGD(levels=levels, value_bits=value_bits)
    if name not in ("randk", "urandk", "bernk", "topk"):
        raise ConfigError(
            f"unknown compressor {name!r}; use none, randk, urandk, bernk, topk or qsgd"
        )
    k: int | None = None
    fraction: float | None = None
    try:
        if arg.isdigit():
            k = int(arg)
        else:
            fraction = float(arg)
    except ValueError:
        raise ConfigError(f"compressor argument must be a count or fraction, got {arg!r}") from None
    if fraction is not None and not math.isfinite(fraction):
        raise ConfigError(f"compressor fraction must be finite, got {arg!r}")
    if name == "randk":
        return RandomK(k=k, fraction=fraction, value_bits=value_bits)
    if name == "bernk":
        return RandomK(k=k, fraction=fraction, bernoulli=True, value_bits=value_bits)
    if name == "urandk":
        return UnbiasedRandomK(k=k, fraction=fraction, value_bits=value_bits)
    return TopK(k=k, fraction=fraction, value_bits=value_bits)
