"""Composable privacy mechanisms: edge secrets, counter-based noise streams, correlated noise."""

from privdl.mechanisms.correlated import (
    correlated_noise,
    incidence_matrix,
    independent_noise,
    split_flat,
)
from privdl.mechanisms.prng import normal_streams
from privdl.mechanisms.secrets import (
    EdgeSecrets,
    KeyTransport,
    LocalKeyTransport,
    agree_edge_secrets,
    node_noise_keys,
)

__all__ = [
    "EdgeSecrets",
    "KeyTransport",
    "LocalKeyTransport",
    "agree_edge_secrets",
    "correlated_noise",
    "incidence_matrix",
    "independent_noise",
    "node_noise_keys",
    "normal_streams",
    "split_flat",
]
