"""How the SFT trainer's ranks share the work: the process group, the training engine and the ranks
that train on the same rows.

``engine=fsdp`` (the default): :class:`~verl.workers.engine.fsdp.FSDPEngine`, plain torch on one
rank and FSDP2 on several; every rank is a data-parallel rank, except that a Ulysses group
(``engine.ulysses_sequence_parallel_size``) shares its rows, each rank on a slice of every sequence.

``engine=megatron``: :class:`~verl.workers.engine.megatron.engine.MegatronEngine`, the RL roles'
megatron-core engine. A tensor x pipeline group of ranks holds one copy of the model and trains on
the same rows (each rank computes the same loss: vocab-parallel logits under tensor parallelism, the
last stage's under pipeline parallelism); data parallel = ranks / (TP x PP), and megatron-core's
DDP averages gradients over the data-parallel ranks only.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import replace

import torch
import torch.distributed as dist

from verl.config.base import ConfigError, check
from verl.config.megatron import MEGATRON
from verl.config.sft_trainer import SFTTrainerConfig
from verl.utils.model import load_hf_config
from verl.workers.engine.base import TrainEngine
from verl.workers.engine.factory import build_engine

ENGINE_KEY = "engine"
"""The config section the engine's keys live in (named in the engine's errors)."""


def init_distributed(config: SFTTrainerConfig, join: bool = True) -> torch.device:
    """Join torchrun's process group when there is one and ``join`` (gloo on CPU, nccl on CUDA); the device."""
    want = config.trainer.device
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device: expected a device this machine has, got 'cuda' (no CUDA GPU here)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if join and int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=datetime.timedelta(seconds=config.trainer.nccl_timeout),
        )
    return torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")


def check_layout(config: SFTTrainerConfig, world_size: int) -> None:
    """Refuse, before anything is built, a Megatron split that the model or the rank count cannot
    take, naming the engine key: TP must divide the model's attention and key/value heads, PP its
    layers, and TP x PP the ranks. Nothing to check for FSDP."""
    engine = config.engine
    if engine.strategy != MEGATRON:
        return
    from verl.workers.engine.megatron.arch import check_parallel  # no megatron-core import

    tp, pp = engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size
    check_parallel(load_hf_config(config.model, section="model"), tp, pp, key=ENGINE_KEY)
    check(
        world_size % (tp * pp) == 0,
        f"{ENGINE_KEY}.tensor_model_parallel_size",
        f"a size that times {ENGINE_KEY}.pipeline_model_parallel_size ({pp}) divides the {world_size} ranks",
        tp,
    )


def build_sft_engine(config: SFTTrainerConfig, module: torch.nn.Module, device: torch.device) -> TrainEngine:
    """The engine ``engine.strategy`` names, training ``module`` with ``optim.*``."""
    engine = config.engine
    # FSDP's offload keys do nothing for SFT (noted as inert); the Megatron engine reads its own
    fsdp = replace(engine, param_offload=False, optimizer_offload=False)
    return build_engine(
        engine.strategy,
        module,
        device,
        fsdp,
        engine,
        ENGINE_KEY,
        optim=config.optim,
        grad_clip=config.optim.clip_grad,
        gradient_checkpointing=config.model.enable_gradient_checkpointing,
    )
