"""Shared builder for the `configs/model_*.py` ml_collections files.

Each config file is `get_config()` returning `model` (the `TransformerConfig`
fields), `mesh_shape` over `(data, fsdp, tensor)` with -1 = the rest, and the
policy-train-step shape (`batch_size`, `seq_len`, `num_micro_batches`,
optimiser settings) that the AOT check and the benchmarks read.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from wmrl.models.config import TransformerConfig, from_mapping, named_config


def model_config(
    size: str,
    *,
    mesh_shape=(-1, 1, 1),
    batch_size: int = 8,
    seq_len: int = 128,
    num_micro_batches: int = 1,
    learning_rate: float = 1e-5,
    **model_overrides,
) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = dataclasses.asdict(named_config(size, **model_overrides))
    c.mesh_shape = tuple(mesh_shape)
    c.batch_size = batch_size
    c.seq_len = seq_len
    c.num_micro_batches = num_micro_batches
    c.learning_rate = learning_rate
    c.weight_decay = 0.0
    return c


def transformer_config(config: ml_collections.ConfigDict) -> TransformerConfig:
    """The validated `TransformerConfig` of a loaded `configs/model_*.py`."""
    return from_mapping(config.model.to_dict())
