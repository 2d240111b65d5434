"""Robust-HDP building blocks: robust PCA, noise-level estimation, noise-aware weights, Table 3."""

from privdl.robust.noise import (
    DegenerateNoiseWarning,
    NoiseWeightState,
    aggregate_noise,
    estimate_noise_levels,
    inverse_variance_weights,
    robust_hdp_weights,
)
from privdl.robust.rpca import (
    PCPResult,
    RPCANotConvergedWarning,
    principal_component_pursuit,
    shrink,
    svt,
)
from privdl.robust.table3 import (
    noise_multiplier,
    rdp_poisson_subsampled_gaussian,
    table3_row,
    update_variance,
)

__all__ = [
    "DegenerateNoiseWarning",
    "NoiseWeightState",
    "PCPResult",
    "RPCANotConvergedWarning",
    "aggregate_noise",
    "estimate_noise_levels",
    "inverse_variance_weights",
    "noise_multiplier",
    "principal_component_pursuit",
    "rdp_poisson_subsampled_gaussian",
    "robust_hdp_weights",
    "shrink",
    "svt",
    "table3_row",
    "update_variance",
]
