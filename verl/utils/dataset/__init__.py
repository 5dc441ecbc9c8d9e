"""Prompt datasets for RL: the row schema, the parquet loader and a resumable data loader.

Modules (import from them directly; this package keeps its import light so the
preprocessing scripts and the scorer processes do not load torch):

* :mod:`verl.utils.dataset.schema`: the row schema, ``make_row``, ``write_splits``;
* :mod:`verl.utils.dataset.records`: raw jsonl/parquet records for ``--local_dataset_path``;
* :mod:`verl.utils.dataset.rl_dataset`: ``RLHFDataset`` and ``collate_fn``;
* :mod:`verl.utils.dataset.dataloader`: ``create_rl_dataloader`` (stateful, exact resume);
* :mod:`verl.builtin.arith`: the built-in arithmetic task of the embedded default.
"""
