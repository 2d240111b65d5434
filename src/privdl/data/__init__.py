"""Datasets, partitioners and per-node batch sampling (issue 2: tasks and data).

Real data: a9a rebuilt from the embedded UCI Adult files, MNIST / Fashion-MNIST (IDX, SHA-256
verified), CIFAR-10 from user-supplied pickles. Synthetic data: DECOR's least-squares task and a
CIFAR-shaped stand-in. Partitioners are disjoint by construction. See docs/data.md.
"""

from privdl.data.adult import A9A_LAYOUT, A9A_N_FEATURES, A9a, feature_names, load_a9a, load_adult
from privdl.data.batching import (
    BatchIndex,
    StackedData,
    gather_batch,
    sample_batches,
    stack_partitions,
)
from privdl.data.cifar import load_cifar10_arrays, read_cifar_batch, synthetic_cifar
from privdl.data.dataset import DATASET_NAMES, Dataset, check_finite, load_dataset
from privdl.data.idx import load_idx_arrays, parse_idx, read_idx
from privdl.data.partition import (
    partition_dirichlet,
    partition_iid,
    partition_shards,
    parts_to_ids,
)
from privdl.data.synthetic import LeastSquaresProblem, least_squares_problem

__all__ = [
    "A9A_LAYOUT",
    "A9A_N_FEATURES",
    "DATASET_NAMES",
    "A9a",
    "BatchIndex",
    "Dataset",
    "LeastSquaresProblem",
    "StackedData",
    "check_finite",
    "feature_names",
    "gather_batch",
    "least_squares_problem",
    "load_a9a",
    "load_adult",
    "load_cifar10_arrays",
    "load_dataset",
    "load_idx_arrays",
    "parse_idx",
    "partition_dirichlet",
    "partition_iid",
    "partition_shards",
    "parts_to_ids",
    "read_cifar_batch",
    "read_idx",
    "sample_batches",
    "stack_partitions",
    "synthetic_cifar",
]
