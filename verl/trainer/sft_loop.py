"""The SFT training loop (:class:`SFTTrainer`); ``python -m verl.trainer.sft_trainer`` runs it.

Several processes (GPUs, or CPU ranks over gloo), as in verl::

    torchrun --standalone --nproc_per_node 8 -m verl.trainer.sft_trainer \\
        data.train_files=~/data/gsm8k_sft/train.parquet data.val_files=~/data/gsm8k_sft/test.parquet \\
        model.path=Qwen/Qwen2.5-0.5B-Instruct optim.lr=1e-5 trainer.total_epochs=2 ...

Every process runs this same loop on its share of each batch (no Ray: SFT needs no rollout). It
trains through the RL roles' engines (:mod:`verl.trainer.sft_parallel`: FSDP, plain torch on one CPU
rank and FSDP2 otherwise; or with ``engine=megatron`` megatron-core's tensor, pipeline and data
parallelism) and writes the same checkpoints: ``global_step_N/model/`` holds the sharded model,
optimizer and LR schedule, every rank's RNG state and ``huggingface/`` (config and tokenizer; the
weights too with ``checkpoint.save_contents`` including ``hf_model``), and ``global_step_N/driver.pt``
the step and data-loader position. A resumed run continues bit for bit (same rank count and layout).
``python -m verl.model_merger merge --local_dir global_step_N/model`` exports the weights (``--backend
megatron`` for Megatron's shards); an RL run starts from that folder with
``actor_rollout_ref.model.path=...``.

The loss of a step is the mean over every assistant token of the whole batch (all ranks and
micro-batches), whatever the micro-batching: each micro-batch adds its summed cross-entropy
divided by the batch's token count.

A vision-language ``model.path`` (an image processor and an image token in its folder) trains on
chats with images (:mod:`verl.utils.dataset.sft_dataset`): rows carry ``[3, n]`` M-RoPE positions
and ``multi_modal_inputs``, which go with them into each micro-batch and the model's forward,
padded or packed, as in RL.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from verl.config.base import ConfigError, check
from verl.config.sft_trainer import SFTTrainerConfig
from verl.protocol import DataProto
from verl.trainer.ppo import checkpoint
from verl.trainer.sft_losses import packed_token_losses, token_losses
from verl.trainer.sft_parallel import build_sft_engine, check_layout, init_distributed
from verl.utils.checkpoint_io import torch_load
from verl.utils.dataset.dataloader import StatefulDataLoader
from verl.utils.dataset.sft_dataset import create_sft_dataset, sft_collate
from verl.utils.dataset.vision import load_vision_processor
from verl.utils.model import load_causal_lm, load_tokenizer_from, resolve_tokenizer_source, save_hf_files
from verl.utils.progress import StepProgress
from verl.utils.tracking import Tracking
from verl.workers import ulysses
from verl.workers.cpu_attention import default_attention
from verl.workers.engine.lora import apply_lora, uses_lora
from verl.workers.engine.micro_batch import equal_size_partitions, split_micro_batches
from verl.workers.packing import enable_packing
from verl.workers.vision import MULTI_MODAL_INPUTS, micro_batch_vision

logger = logging.getLogger(__name__)

MODEL_DIR = "model"
INPUT_KEYS = ["input_ids", "attention_mask", "position_ids", "loss_mask"]


def _all_reduce_sum(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def multi_modal_column(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The rows' ``multi_modal_inputs`` as a ``DataProto`` column (none for a text model's rows)."""
    if not rows or MULTI_MODAL_INPUTS not in rows[0]:
        return {}
    column = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        column[i] = row[MULTI_MODAL_INPUTS]
    return {MULTI_MODAL_INPUTS: column}


class SFTTrainer:
    def __init__(self, config: SFTTrainerConfig, distributed: bool = True) -> None:
        """``distributed=False``: this process trains alone, even under torchrun (the built-in
        model's warm-up, which rank 0 runs before the ranks join)."""
        self.config = config
        self.device = init_distributed(config, join=distributed)
        joined = distributed and dist.is_initialized()
        self.rank = dist.get_rank() if joined else 0
        self.world_size = dist.get_world_size() if joined else 1
        _barrier()  # rank 0 has written the built-in model and data (run_sft)
        self._set_layout()
        self._convert_micro_batch_size()
        self._check_batch_size()
        model = config.model
        self.tokenizer = load_tokenizer_from(resolve_tokenizer_source(model, section="model"))
        self.vision = load_vision_processor(model.path, self.tokenizer)
        """The model's image processor and image token (a vision-language model), else None."""
        if self.vision is not None and self.sp_size > 1:
            raise ConfigError(
                "engine.ulysses_sequence_parallel_size: sequence parallelism does not split M-RoPE positions "
                f"yet; expected 1 for a vision-language model.path, got {self.sp_size}"
            )
        self.train_data = self.build_dataset(config.data.train_files, config.data.train_max_samples)
        self.val_data = (
            self.build_dataset(config.data.val_files, config.data.val_max_samples)
            if config.data.val_files
            else None
        )
        self.loader = StatefulDataLoader(
            self.train_data,
            config.data.train_batch_size,
            shuffle=config.data.shuffle,
            seed=config.trainer.seed,
            drop_last=True,
            collate_fn=list,
        )
        if len(self.loader) == 0:
            raise ConfigError(
                f"data.train_batch_size: expected at most the {len(self.train_data)} training rows, got "
                f"{config.data.train_batch_size} (no full batch)"
            )
        self.total_steps = (
            config.trainer.total_training_steps or len(self.loader) * config.trainer.total_epochs
        )
        config.optim.total_training_steps = self.total_steps
        torch.manual_seed(config.trainer.seed)
        module = self.build_module()
        if self.packs_sequences and model.use_remove_padding:
            module = enable_packing(module)
        if uses_lora(model):
            module = apply_lora(module, model)
        self.engine = build_sft_engine(config, module, self.device)
        self.packed = self.packs_sequences and model.use_remove_padding and self.engine.packs_sequences
        """Micro-batches run as packed rows (``model.use_remove_padding``; the Megatron engine runs them padded)."""
        self.token_losses = packed_token_losses if self.packed else token_losses
        if self.engine.rows_group is not None:
            self.dp_rank = self.engine.data_parallel_rank()  # megatron-core orders its groups' ranks
        self.global_step = 0
        self.epoch = 0
        self.val_losses: list[float] = []
        """Validation losses of this process's run, in order (before training, then each validation)."""
        self.tracker = None
        if self.rank == 0:
            trainer = config.trainer
            self.tracker = Tracking(trainer.project_name, trainer.experiment_name, trainer.logger, config)

    # ------------------------------------------------------------------ what is trained, on what
    name = "SFT"
    """Shown on the progress bar."""
    packs_sequences = True
    """Whether ``model.use_remove_padding`` (and with it sequence parallelism) applies to this trainer."""

    def build_dataset(self, files: Any, max_samples: int) -> Any:
        return create_sft_dataset(files, self.config.data, self.tokenizer, max_samples, self.vision)

    def build_module(self) -> torch.nn.Module:
        attention = default_attention(self.device, self.config.engine)
        return load_causal_lm(self.config.model, section="model", attention=attention)

    def row_tokens(self, row: dict[str, list[int]]) -> int:
        """A training row's token count (what ``trainer.balance_batch`` evens out over ranks)."""
        return len(row["input_ids"])

    def summary(self) -> list[str]:
        """Lines printed at the end of a run: the validation losses, before training and after each validation."""
        if not self.val_losses:
            return []
        return ["validation loss: " + " -> ".join(f"{v:.4f}" for v in self.val_losses)]

    def hf_export_options(self) -> dict[str, Any]:
        """Extra arguments of :func:`save_hf_files` for this trainer's models: a vision-language
        model's image processor files go with it."""
        return {"processor_from": self.config.model.path} if self.vision is not None else {}

    # ------------------------------------------------------------------ set-up checks
    def _set_layout(self) -> None:
        """Which ranks train on the same rows (:mod:`verl.trainer.sft_parallel`); a Megatron split the
        model or the rank count cannot take is refused here, before anything is built."""
        engine = self.config.engine
        check_layout(self.config, self.world_size)
        self.sp_size = engine.ulysses_sequence_parallel_size
        self.sp_group = ulysses.build_groups(self.sp_size, "engine.ulysses_sequence_parallel_size")
        self.mp_size = engine.model_parallel_size()
        """Ranks holding one copy of the model (Megatron's TP x PP, else 1): each computes the same loss."""
        self.replicas = self.sp_size * self.mp_size
        """Ranks that train on the same rows: a Ulysses group or a Megatron model-parallel group."""
        self.dp_size = self.world_size // self.replicas
        """Data-parallel ranks."""
        self.dp_rank = self.rank // self.replicas

    def _convert_micro_batch_size(self) -> None:
        data = self.config.data
        if data.micro_batch_size is not None:
            data.micro_batch_size_per_gpu = max(1, data.micro_batch_size // self.dp_size)
            logger.warning(
                "config note: converted data.micro_batch_size=%d -> data.micro_batch_size_per_gpu=%d "
                "(%d data-parallel ranks)",
                data.micro_batch_size,
                data.micro_batch_size_per_gpu,
                self.dp_size,
            )
            data.micro_batch_size = None

    def _check_batch_size(self) -> None:
        size = self.config.data.train_batch_size
        check(
            size % self.dp_size == 0,
            "data.train_batch_size",
            f"a multiple of the {self.dp_size} data-parallel ranks (every one takes an equal share)",
            size,
        )

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, float]:
        """Train for ``total_steps`` optimizer steps; returns the last step's metrics."""
        trainer = self.config.trainer
        resumed = self._load_checkpoint()
        if trainer.val_before_train and not resumed and self.val_data is not None:
            before = self.validate()
            self._log(before, self.global_step)
            self.val_losses.append(before["val/loss"])
        batches = self._batches()
        metrics: dict[str, float] = {}
        enabled = None if self.rank == 0 else False
        with StepProgress(
            self.total_steps, initial_step=self.global_step, enabled=enabled, desc=self.name
        ) as progress:
            while self.global_step < self.total_steps:
                self.global_step += 1
                metrics = self.train_step(next(batches))
                last = self.global_step == self.total_steps
                if self.val_data is not None and (
                    last or (trainer.test_freq > 0 and self.global_step % trainer.test_freq == 0)
                ):
                    metrics.update(self.validate())
                    self.val_losses.append(metrics["val/loss"])
                if trainer.save_freq > 0 and (last or self.global_step % trainer.save_freq == 0):
                    self.save_checkpoint()
                metrics["train/epoch"] = self.epoch
                self._log(metrics, self.global_step)
                progress.update(metrics)
                checkpoint.fault_point("sft_after_step", self.global_step)
        return metrics

    def _batches(self) -> Iterator[list[dict[str, list[int]]]]:
        while True:
            for batch in self.loader:
                self.epoch = self.loader.epoch
                yield batch

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.tracker is not None:
            self.tracker.log(metrics, step=step)

    def _my_rows(self, rows: list[dict[str, list[int]]]) -> list[dict[str, list[int]]]:
        """This data-parallel rank's equal share of a batch: dealt by length (``trainer.balance_batch``)
        or in order. The ranks of a sequence-parallel or Megatron model-parallel group get the same rows."""
        if self.dp_size == 1:
            return rows
        if self.config.trainer.balance_batch:
            groups = equal_size_partitions([self.row_tokens(r) for r in rows], self.dp_size)
            return [rows[int(i)] for i in groups[self.dp_rank]]
        share = len(rows) // self.dp_size
        return rows[self.dp_rank * share : (self.dp_rank + 1) * share]

    def train_step(self, rows: list[dict[str, list[int]]]) -> dict[str, float]:
        data = self.config.data
        mine = self._my_rows(rows)
        batch = DataProto.from_dict(sft_collate(mine, self.tokenizer.pad_token_id), multi_modal_column(mine))
        (tokens,) = _all_reduce_sum([float(batch.batch["loss_mask"][:, 1:].sum())])
        tokens /= self.replicas  # a group's ranks hold the same rows
        # The engine averages gradients over ranks (FSDP: all; Megatron: the data-parallel ones): undo
        # that, then the token mean. Under sequence parallelism each rank's loss covers its own slice of
        # the rows, so the sum over all ranks is the batch's; a Megatron group's ranks share one loss.
        scale = self.world_size / self.mp_size / max(tokens, 1.0)
        micro_batches, _ = split_micro_batches(
            batch,
            INPUT_KEYS,
            data.micro_batch_size_per_gpu,
            data.use_dynamic_bsz,
            data.max_token_len_per_gpu * self.sp_size,  # a rank runs 1/sp of each micro-batch's tokens
        )

        def loss_fn(module, micro):
            losses, mask = self.token_losses(module, micro)
            summed = (losses * mask).sum()
            return summed * scale, {"loss_sum": float(summed.detach())}

        with ulysses.sequence_parallel(self.sp_group):
            step = self.engine.train_step(micro_batches, loss_fn, [1.0] * len(micro_batches))
        lr = self.engine.current_lr()
        self.engine.lr_scheduler_step()
        loss_sum, skipped = _all_reduce_sum([step["loss_sum"], step["update_skipped"]])
        return {
            "train/loss": loss_sum / self.mp_size / max(tokens, 1.0),
            "train/grad_norm": step["grad_norm"],
            "train/lr": lr,
            "train/tokens": tokens,
            "train/update_skipped": float(skipped > 0),
        }

    def validate(self) -> dict[str, float]:
        """``val/loss``: the mean cross-entropy over every assistant token of the validation set."""
        rows = list(range(len(self.val_data)))
        share = -(-len(rows) // self.dp_size)  # every rank runs as many forward passes (collectives)
        mine = [self.val_data[i] for i in rows[self.dp_rank * share : (self.dp_rank + 1) * share]]
        mine += [self._filler_row()] * (share - len(mine))
        size = self.config.data.micro_batch_size_per_gpu
        micro_batches = [self._micro_batch(mine[i : i + size]) for i in range(0, share, size)]

        def forward_fn(module, micro):
            losses, mask = self.token_losses(module, micro)
            return {"loss_sum": (losses * mask).sum(), "tokens": mask.sum()}

        with ulysses.sequence_parallel(self.sp_group):
            outputs = self.engine.infer(micro_batches, forward_fn)
        loss_sum, tokens = _all_reduce_sum(
            [sum(float(o["loss_sum"]) for o in outputs), sum(float(o["tokens"]) for o in outputs)]
        )
        return {"val/loss": loss_sum / max(tokens, 1.0)}

    def _micro_batch(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Rows as one right-padded micro-batch, with their image inputs (a vision-language model's)."""
        images = [row[MULTI_MODAL_INPUTS] for row in rows if MULTI_MODAL_INPUTS in row]
        return {**sft_collate(rows, self.tokenizer.pad_token_id), **micro_batch_vision(images)}

    def _filler_row(self) -> dict[str, Any]:
        """A one-pad row without targets: what a rank with fewer validation rows runs instead."""
        row: dict[str, Any] = {"input_ids": [self.tokenizer.pad_token_id], "loss_mask": [0]}
        if self.vision is not None:
            row.update(position_ids=torch.zeros(3, 1, dtype=torch.long), multi_modal_inputs={})
        return row

    # ------------------------------------------------------------------ checkpoints
    def checkpointer(self) -> checkpoint.Checkpointer:
        trainer = self.config.trainer
        return checkpoint.Checkpointer.for_run(
            trainer,
            self.world_size,
            {MODEL_DIR: trainer.max_ckpt_to_keep},
            fault="sft_kill_during_save",
            writer=self.rank == 0,
            barrier=_barrier,
        )

    def save_checkpoint(self) -> str:
        """``global_step_N/{model/, driver.pt}``, then the pointer (the commit), then rotation."""
        state = {"dataloader": self.loader.state_dict()}
        return self.checkpointer().save(self.global_step, self._write_model, state)

    def _write_model(self, folder: str) -> None:
        """Every rank's shards, RNG state and (rank 0) the Hugging Face files under ``folder/model``."""
        contents = self.config.checkpoint.save_contents
        model_dir = os.path.join(folder, MODEL_DIR)
        os.makedirs(model_dir, exist_ok=True)
        self.engine.save(model_dir, contents)
        torch.save(
            {"torch_rng": torch.get_rng_state()}, os.path.join(model_dir, f"worker_rank_{self.rank}.pt")
        )
        full = self.engine.full_model_state_dict_on_cpu() if "hf_model" in contents else None
        adapter = None
        if self.engine.lora:
            adapter = (self.engine.adapter_config(), self.engine.adapter_state_dict_on_cpu())
        if self.rank == 0:
            target = os.path.join(model_dir, "huggingface")
            save_hf_files(
                self.engine.hf_module, self.tokenizer, target, full, adapter, **self.hf_export_options()
            )

    def _load_checkpoint(self) -> bool:
        """Resume as ``trainer.resume_mode`` says; True when a checkpoint was loaded."""
        found = self.checkpointer().resume()
        if found is None:
            return False
        folder, state = found
        model_dir = os.path.join(folder, MODEL_DIR)
        self.engine.load(model_dir, self.config.checkpoint.load_contents)
        torch.set_rng_state(torch_load(os.path.join(model_dir, f"worker_rank_{self.rank}.pt"))["torch_rng"])
        self.global_step = state["global_steps"]
        self.loader.load_state_dict(state["dataloader"])
        self.epoch = self.loader.epoch
        checkpoint.set_rng_state({**state["rng"], "torch": torch.get_rng_state()})
        logger.info("resumed from %s (step %d)", folder, self.global_step)
        return True

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.finish()
            self.tracker = None
