"""``CriticWorker``: the value model for GAE/PPO (``compute_values``, ``update_critic``)."""

from __future__ import annotations

import os

import torch

from verl.algorithms.actor_loss import compute_critic_loss
from verl.config.critic import CriticConfig
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.checkpoint_io import torch_load
from verl.utils.model import load_value_model
from verl.workers import ulysses
from verl.workers.cpu_attention import default_attention
from verl.workers.engine.base import TrainEngine
from verl.workers.engine.factory import build_engine, reads_hf_weights
from verl.workers.engine.micro_batch import restore_order, split_micro_batches
from verl.workers.forward import POLICY_INPUT_KEYS, response_values
from verl.workers.packing import enable_packing
from verl.workers.ppo_update import UpdateSpec, prefixed, rows_per_rank, run_ppo_updates

CRITIC_LOSS_KEYS = ["values", "returns", "response_mask"]


class CriticWorker(Worker):
    def __init__(self, config: CriticConfig, nccl_timeout_s: float = 600.0) -> None:
        """``nccl_timeout_s``: the process-group timeout (``actor_rollout_ref.nccl_timeout``; colocated
        roles share one group, and the critic may create it first)."""
        super().__init__()
        self.config = config
        self.nccl_timeout_s = nccl_timeout_s
        self.engine: TrainEngine | None = None

    def process_reusable(self) -> bool:
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group(self.nccl_timeout_s)
        cfg = self.config
        torch.manual_seed(0)  # the value head is freshly initialised: every rank must draw the same one
        attention = default_attention(self.device, cfg.model.fsdp_config)
        module = load_value_model(cfg.model, attention=attention, weights=reads_hf_weights(cfg))
        self.engine = build_engine(
            cfg.strategy,
            enable_packing(module) if cfg.model.use_remove_padding else module,
            self.device,
            cfg.model.fsdp_config,
            cfg.megatron,
            "critic.megatron",
            optim=cfg.optim,
            grad_clip=cfg.grad_clip,
            gradient_checkpointing=cfg.model.enable_gradient_checkpointing,
            value_head=True,
        )
        self.packed = cfg.model.use_remove_padding and self.engine.packs_sequences
        self.sp_size = cfg.ulysses_sequence_parallel_size
        self.sp_group = ulysses.build_groups(self.sp_size, "critic.ulysses_sequence_parallel_size")
        # ranks that hold the same rows (a Ulysses group, or Megatron's model-parallel group) shuffle alike
        if self.sp_group is not None:
            self.rows_group, self.replicas, data_rank = self.sp_group, self.sp_size, self.rank // self.sp_size
        else:
            self.rows_group, self.replicas = self.engine.rows_group, self.engine.replicas
            data_rank = self.engine.data_parallel_rank()
        self.shuffle_generator = torch.Generator().manual_seed(data_rank)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        cfg = self.config
        data = ulysses.gather_group_batch(data, self.rows_group)
        micro_batches, groups = split_micro_batches(
            data,
            POLICY_INPUT_KEYS,
            cfg.forward_micro_batch_size_per_gpu,
            cfg.use_dynamic_bsz,
            cfg.forward_max_token_len_per_gpu * self.sp_size,  # a rank holds 1/sp of the tokens
        )
        with ulysses.sequence_parallel(self.sp_group):
            outs = self.engine.infer(
                micro_batches, lambda m, b: {"values": response_values(m, b, self.packed)}
            )
        values = restore_order([o["values"] for o in outs], groups)
        out = DataProto.from_dict({"values": values * data.batch["response_mask"]})
        return ulysses.own_share(out, self.rows_group)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        cfg = self.config

        def loss_fn(module, micro):
            loss, metrics = compute_critic_loss(response_values(module, micro, self.packed), micro, cfg)
            return loss * self.sp_size, metrics  # as the actor's (ActorRolloutRefWorker.update_actor)

        spec = UpdateSpec(
            mini_batch_rows=rows_per_rank(
                cfg.ppo_mini_batch_size,
                cfg.rollout_n,
                self.world_size // self.replicas,
                "critic.ppo_mini_batch_size",
            ),
            micro_batch_size=cfg.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=cfg.use_dynamic_bsz,
            max_token_len=cfg.ppo_max_token_len_per_gpu * self.sp_size,
            epochs=cfg.ppo_epochs,
            shuffle=cfg.shuffle,
            replicas=self.replicas,
        )
        data = ulysses.gather_group_batch(data, self.rows_group)
        with ulysses.sequence_parallel(self.sp_group):
            metrics = run_ppo_updates(
                self.engine, data, POLICY_INPUT_KEYS + CRITIC_LOSS_KEYS, spec, loss_fn, self.shuffle_generator
            )
        metrics["lr"] = self.engine.lr_scheduler_step()
        return DataProto(meta_info={"metrics": prefixed(metrics, "critic")})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.engine.save(folder, self.config.checkpoint.save_contents)
        torch.save(
            {"shuffle_generator": self.shuffle_generator.get_state(), "torch_rng": torch.get_rng_state()},
            os.path.join(folder, f"worker_rank_{self.rank}.pt"),
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, folder: str) -> None:
        self.engine.load(folder, self.config.checkpoint.load_contents)
        state = torch_load(os.path.join(folder, f"worker_rank_{self.rank}.pt"))
        self.shuffle_generator.set_state(state["shuffle_generator"])
        torch.set_rng_state(state["torch_rng"])
