"""Reward-model training: a one-label score head trained on preference pairs (Bradley-Terry).

One CPU (the embedded default: a reward model on top of the built-in tiny model, trained on the
built-in arithmetic preference pairs, the right sum against a near miss; prints the validation
loss before and after and the pairwise accuracy)::

    python -m verl.trainer.rm_trainer

Several processes, as for SFT::

    torchrun --standalone --nproc_per_node 8 -m verl.trainer.rm_trainer \\
        data.train_files=~/data/prefs/train.parquet data.val_files=~/data/prefs/test.parquet \\
        model.path=Qwen/Qwen2.5-0.5B-Instruct optim.lr=1e-5 trainer.total_epochs=1

The loop, engine, checkpoints, exact resume and loggers are the SFT trainer's
(:mod:`verl.trainer.sft_trainer`); what differs is the data (pairs), the model (the base model
with a fresh one-label head, or a reward model to train further) and the loss: the mean over the
batch's pairs of ``-log sigmoid(r_chosen - r_rejected)``, whatever the micro-batching or rank
count. A conversation is scored exactly as the reward-model worker scores rollouts in RL
(:mod:`verl.utils.reward_inputs`). The exported model (``huggingface/`` with
``checkpoint.save_contents`` including ``hf_model``, or the merger's output) is a
``...ForSequenceClassification`` checkpoint: ``reward_model.model.path`` of an RL run.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig

from verl.builtin.assets import prepare_preference_assets
from verl.config.cli import user_errors_as_one_line
from verl.config.rm_trainer import RMTrainerConfig
from verl.protocol import DataProto
from verl.trainer.sft_loop import SFTTrainer, _all_reduce_sum
from verl.trainer.sft_trainer import prepare_sft_argv, run_sft
from verl.utils.dataset.preference_dataset import PreferenceDataset
from verl.utils.model import load_reward_model
from verl.utils.reward_inputs import RM_INPUT_KEYS, last_token_scores, left_padded
from verl.workers.engine.micro_batch import split_micro_batches


def pair_tensors(pairs: list[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Each pair as one row ``[chosen | rejected]``, both sides left-padded to one width (so a
    micro-batch never separates a pair, and a row's token count is the pair's)."""
    sides = left_padded([p["chosen"] for p in pairs] + [p["rejected"] for p in pairs], pad_token_id)
    n = len(pairs)
    return {key: torch.cat([t[:n], t[n:]], dim=1) for key, t in sides.items()}


def pair_scores(module: torch.nn.Module, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``(chosen, rejected)`` of the micro-batch's pairs."""
    width = micro["input_ids"].shape[1] // 2
    sides = {key: torch.cat([micro[key][:, :width], micro[key][:, width:]]) for key in RM_INPUT_KEYS}
    scores = last_token_scores(module, sides)["scores"]
    return scores[: len(scores) // 2], scores[len(scores) // 2 :]


class RewardModelTrainer(SFTTrainer):
    name = "RM"
    packs_sequences = False  # pairs run padded: model.use_remove_padding is noted as inert

    def __init__(self, config: RMTrainerConfig) -> None:
        self.val_accuracies: list[float] = []
        """Pairwise validation accuracies of this run, in order (before training, then each validation)."""
        super().__init__(config)

    def build_dataset(self, files: Any, max_samples: int) -> Any:
        return PreferenceDataset(files, self.tokenizer, self.config.data, max_samples)

    def build_module(self) -> torch.nn.Module:
        return load_reward_model(self.config.model, key="model.path", require_trained_head=False)

    def hf_export_options(self) -> dict[str, Any]:
        # the token classifier trained here has a bias-free head: the same weights as a sequence classifier
        name = type(self.engine.hf_module).__name__.replace(
            "ForTokenClassification", "ForSequenceClassification"
        )
        return {"architecture": name}

    def row_tokens(self, row: dict[str, list[int]]) -> int:
        return len(row["chosen"]) + len(row["rejected"])

    def train_step(self, rows: list[dict[str, list[int]]]) -> dict[str, float]:
        data = self.config.data
        batch = DataProto.from_dict(pair_tensors(self._my_rows(rows), self.tokenizer.pad_token_id))
        scale = self.world_size / len(rows)  # ranks' gradients are averaged: undo that, then the pair mean
        micro_batches, _ = split_micro_batches(
            batch,
            RM_INPUT_KEYS,
            data.micro_batch_size_per_gpu,
            data.use_dynamic_bsz,
            data.max_token_len_per_gpu,
        )

        def loss_fn(module, micro):
            chosen, rejected = pair_scores(module, micro)
            losses = -F.logsigmoid(chosen - rejected)
            correct = float((chosen > rejected).sum())
            return losses.sum() * scale, {"loss_sum": float(losses.sum().detach()), "correct": correct}

        step = self.engine.train_step(micro_batches, loss_fn, [1.0] * len(micro_batches))
        lr = self.engine.current_lr()
        self.engine.lr_scheduler_step()
        loss_sum, correct, skipped = _all_reduce_sum(
            [step["loss_sum"], step["correct"], step["update_skipped"]]
        )
        return {
            "train/loss": loss_sum / len(rows),
            "train/accuracy": correct / len(rows),
            "train/grad_norm": step["grad_norm"],
            "train/lr": lr,
            "train/update_skipped": float(skipped > 0),
        }

    def validate(self) -> dict[str, float]:
        """``val/loss`` (mean pair loss) and ``val/accuracy`` (share of pairs scored the right way
        round) over the whole validation set."""
        count = len(self.val_data)
        share = -(-count // self.world_size)  # every rank runs as many forward passes (FSDP gathers)
        indices = range(self.rank * share, (self.rank + 1) * share)
        pairs = [self.val_data[min(i, count - 1)] for i in indices]  # past the end: repeats, not counted
        valid = torch.tensor([float(i < count) for i in indices])
        size = self.config.data.micro_batch_size_per_gpu
        micro_batches = [
            {**pair_tensors(pairs[i : i + size], self.tokenizer.pad_token_id), "valid": valid[i : i + size]}
            for i in range(0, share, size)
        ]

        def forward_fn(module, micro):
            chosen, rejected = pair_scores(module, micro)
            losses = -F.logsigmoid(chosen - rejected)
            return {
                "loss_sum": (losses * micro["valid"]).sum(),
                "correct": ((chosen > rejected).float() * micro["valid"]).sum(),
            }

        outputs = self.engine.infer(micro_batches, forward_fn)
        loss_sum, correct = _all_reduce_sum(
            [sum(float(o["loss_sum"]) for o in outputs), sum(float(o["correct"]) for o in outputs)]
        )
        metrics = {"val/loss": loss_sum / count, "val/accuracy": correct / count}
        self.val_accuracies.append(metrics["val/accuracy"])
        return metrics

    def summary(self) -> list[str]:
        lines = super().summary()
        if self.val_accuracies:
            lines.append("pairwise accuracy: " + " -> ".join(f"{a:.3f}" for a in self.val_accuracies))
        return lines


def run_rm(config: RMTrainerConfig) -> dict[str, float]:
    """Train a reward model from ``config``; prints the validation loss and pairwise accuracy
    before training and after each validation."""
    return run_sft(config, RewardModelTrainer, prepare_preference_assets)


def main_with_config(cfg: DictConfig) -> None:
    from verl.config.sft_trainer import to_typed_sft_config

    try:
        run_rm(to_typed_sft_config(cfg, RMTrainerConfig))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@hydra.main(config_path="config", config_name="rm_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        main_with_config(cfg)


if __name__ == "__main__":
    sys.argv[1:] = prepare_sft_argv(sys.argv[1:], config_name="rm_trainer", schema=RMTrainerConfig)
    main()
