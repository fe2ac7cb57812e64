"""Datasets and federated partitions; ``load_dataset`` never downloads, it reads standard files
from known places (:func:`fedge.data.formats.search_dirs`) and says where it looked.

>>> from fedge.data import load_dataset, partition
>>> ds = load_dataset("digits", resize=28)                      # (1437, 1, 28, 28) normalized
>>> parts = partition("dirichlet", ds.y_train.numpy(), 10, seed=0, alpha=0.5)
"""

from fedge.data.dataset import Dataset
from fedge.data.partition import (
    PARTITIONERS,
    PartitionerSpec,
    partition,
    partition_summary,
    partitioner_names,
    resolve_partition_params,
)
from fedge.data.registry import (
    DATASETS,
    DatasetStatus,
    available_datasets,
    dataset_names,
    get_dataset_spec,
    load_dataset,
    register_dataset,
)
from fedge.data.spec import DatasetSpec, RawData

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetSpec",
    "DatasetStatus",
    "PARTITIONERS",
    "PartitionerSpec",
    "RawData",
    "available_datasets",
    "dataset_names",
    "get_dataset_spec",
    "load_dataset",
    "partition",
    "partition_summary",
    "partitioner_names",
    "register_dataset",
    "resolve_partition_params",
]
