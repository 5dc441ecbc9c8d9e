"""``ActorRolloutRefWorker``: the policy's roles, enabled by ``role``.

* ``actor``: trains the policy (a :class:`TrainEngine`);
* ``rollout``: generates (a :class:`Rollout` backend);
* ``ref``: the frozen reference policy (an inference-only engine).

``role="actor_rollout_ref"`` (or ``"actor_rollout"``) colocates them in one process per
device: the hybrid engine. After each actor update the driver has the new weights sent to the
rollout in process (:meth:`update_weights`, a phase of its own, verified by a probe); the
version counter, owned by the driver, travels with every sample. The weight paths live in
:mod:`verl.workers.weight_sync`, the actor's loss and update sizes in :mod:`verl.workers.actor_update`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from verl.config.actor import ActorRolloutRefConfig
from verl.config.rollout_backends import rollout_backend
from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.utils.checkpoint_io import torch_load
from verl.utils.model import (
    TokenizerSource,
    apply_liger,
    load_causal_lm,
    load_tokenizer_from,
    resolve_tokenizer_source,
    save_hf_files,
)
from verl.workers import ulysses
from verl.workers.actor_update import ACTOR_LOSS_KEYS, ActorLoss, actor_update_spec, update_perf_metrics
from verl.workers.cpu_attention import default_attention
from verl.workers.engine.base import TrainEngine
from verl.workers.engine.factory import build_engine, reads_hf_weights
from verl.workers.engine.lora import uses_lora
from verl.workers.engine.micro_batch import restore_order, split_micro_batches
from verl.workers.forward import POLICY_INPUT_KEYS, EntropyOptions, response_log_probs
from verl.workers.packing import enable_packing
from verl.workers.ppo_update import prefixed, run_ppo_updates
from verl.workers.rollout import build_rollout, build_server
from verl.workers.rollout.staged import StagedWeights
from verl.workers.rollout.tp_group import engine_seed
from verl.workers.rollout.tp_server import build_tp_server
from verl.workers.vision import freeze_vision_tower
from verl.workers.weight_sync import WeightSync
from verl.workers.weight_transport import Parcel

ROLES = ("actor", "rollout", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")
"""The role names verl's workers take: the parts they hold, joined by ``_``."""


class ActorRolloutRefWorker(Worker):
    def __init__(
        self,
        config: ActorRolloutRefConfig,
        role: str = "actor_rollout_ref",
        tokenizer: TokenizerSource | None = None,
        distillation: Any = None,
    ) -> None:
        """``tokenizer``: where the driver loaded its tokenizer from (it may come from
        ``data.tokenizer``); by default ``model.tokenizer_path`` or ``model.path``. ``distillation``:
        the ``distillation.distillation_loss`` section when the actor distils from teachers."""
        super().__init__()
        self.distillation = distillation
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        self.config = config
        self.role = role
        parts = set(role.split("_"))
        self.is_actor, self.is_rollout, self.is_ref = "actor" in parts, "rollout" in parts, "ref" in parts
        self.actor = self.ref = self.rollout = None
        self.server = self.front = None  # server mode (rollout.mode=async)
        self.staged: StagedWeights | None = None
        self.param_count = 0
        self.last_sequence: list[int] | None = None  # the weight-sync probe after the first update
        self.version = 0
        # verl's hybrid engine: a generation after an actor update runs the updated weights, also when
        # the driver (a recipe written for verl) never calls update_weights
        self.rollout_behind = False
        self.tokenizer_source = tokenizer or resolve_tokenizer_source(config.model)

    def process_reusable(self) -> bool:
        # an inference engine (vLLM, SGLang) or a server keeps state beyond this object
        in_worker = self.rollout is None or rollout_backend(self.config.rollout.name).keeps_state_in_worker
        return self.server is None and in_worker

    # ------------------------------------------------------------------ setup
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group(self.config.nccl_timeout)
        model_cfg = self.config.model
        torch.manual_seed(self.config.rollout.seed + self.rank)
        self.tokenizer = load_tokenizer_from(self.tokenizer_source)
        use_lora = uses_lora(model_cfg)
        self.sp_size = self.config.actor.ulysses_sequence_parallel_size
        self.sp_group = ulysses.build_groups(
            self.sp_size, "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        )
        if self.is_actor:
            actor_cfg = self.config.actor
            module = self._load_policy(actor_cfg)
            if actor_cfg.freeze_vision_tower:
                freeze_vision_tower(module)
            self.actor = build_engine(
                actor_cfg.strategy,
                module,
                self.device,
                actor_cfg.fsdp_config,
                actor_cfg.megatron,
                "actor_rollout_ref.actor.megatron",
                optim=actor_cfg.optim,
                grad_clip=actor_cfg.grad_clip,
                gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
                lora=model_cfg if use_lora else None,
            )
            self.param_count = self.actor.parameter_count()
        if self.is_ref and not (use_lora and self.is_actor):  # with LoRA: the actor, adapters off
            ref_cfg = self.config.ref
            module = self._load_policy(ref_cfg)
            key = "actor_rollout_ref.ref.megatron"
            self.ref = build_engine(
                ref_cfg.strategy, module, self.device, ref_cfg.fsdp_config, ref_cfg.megatron, key
            )
        self._set_rows_group(self.actor or self.ref)
        if self.is_rollout:
            self._build_rollout()
        self.weight_sync = WeightSync(
            self.config, self.device, self.tokenizer, self.actor, self.param_count, self.engine, self.staged
        )
        # the engine started with other weights (random, or the base without the adapter)
        other_weights = self.config.rollout.load_format.startswith("dummy") or model_cfg.lora_adapter_path
        if self.is_rollout and self.is_actor and other_weights:
            self.update_weights(0)

    def _build_rollout(self) -> None:
        """The rollout engine, the versions staged for it, and in server mode (``rollout.mode=async``)
        the server in front of it."""
        self.rollout = build_rollout(
            self.config.rollout,
            self.config.model,
            self.tokenizer,
            self.device,
            engine_seed(self.config.rollout, self.rank),  # the ranks of one engine share it
        )
        self.staged = StagedWeights(self.rollout)
        if self.config.rollout.mode == "async":
            name = os.path.basename(os.path.normpath(os.path.expanduser(self.config.model.path)))
            # a tensor-parallel engine: its first rank fronts the server, the others replay its calls
            build = build_server if getattr(self.rollout, "tp", None) is None else build_tp_server
            self.server, self.front = build(self.rollout, self.config.rollout, self.tokenizer, name)

    def _set_rows_group(self, engine) -> None:
        """Ranks that hold the same rows: a Ulysses group, or the engine's model-parallel group
        (Megatron); they gather their shares of a batch (:func:`ulysses.gather_group_batch`)."""
        if self.sp_group is not None or engine is None:
            self.rows_group, self.replicas, data_rank = self.sp_group, self.sp_size, self.rank // self.sp_size
        else:
            self.rows_group, self.replicas = engine.rows_group, engine.replicas
            data_rank = engine.data_parallel_rank()
        seed = (self.config.actor.data_loader_seed or 0) + data_rank  # a group shuffles alike
        self.shuffle_generator = torch.Generator().manual_seed(seed)

    def _load_policy(self, role):
        """The HF policy for ``role`` (the actor's or the reference's section)."""
        attention = default_attention(self.device, role.fsdp_config)
        module = load_causal_lm(self.config.model, attention=attention, weights=reads_hf_weights(role))
        if self.config.model.use_liger and self.device.type == "cuda":
            apply_liger(module, "actor_rollout_ref.model.use_liger")
        return enable_packing(module) if self.config.model.use_remove_padding else module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def tokenizer_info(self) -> dict[str, int | None]:
        """The ids this worker pads and ends responses with, and its vocabulary size (what the
        driver's tokenizer must agree with)."""
        tok = self.tokenizer
        return {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "vocab_size": len(tok)}

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def server_address(self) -> str | None:
        """Server mode: the base URL of this rank's OpenAI-compatible front (loopback); None on the
        ranks of a tensor-parallel engine but its first, which fronts the engine (one server each)."""
        if self.server is None:
            raise RuntimeError("this rollout worker runs no server (actor_rollout_ref.rollout.mode=sync)")
        return self.front.address if self.front is not None else None

    @property
    def engine(self):
        """What weight updates and the probe go to: the server (between two of its steps) in
        server mode, else the rollout."""
        return self.server if self.server is not None else self.rollout

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if self.server is not None:
            raise RuntimeError(
                "actor_rollout_ref.rollout.mode=async: generation goes through the rollout servers "
                "(one request per sample), not through batched worker calls"
            )
        if self.rollout_behind:
            self.update_weights(self.version + 1)
        self.rollout.wake_up()
        if self.staged.versions or "weight_version" in prompts.meta_info:  # one exact version per batch
            out = self.staged.generate(prompts)
        else:
            out = self.rollout.generate_sequences(prompts)
        self.rollout.sleep()
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, version: int) -> dict[str, float]:
        """Push the actor's weights into the colocated rollout as ``version`` (the driver owns the
        counter), then verify that the engine runs them (``rollout.weight_sync_check``): the weights
        read back from the engine must hash as the ones sent, and a probe's log-probs stay close."""
        check = self.weight_sync.prepare_check(version, self.last_sequence)
        metrics = self.weight_sync.push(version, check)
        self.version = version
        metrics.update(self.weight_sync.verify(version, check))
        self.rollout_behind = False
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_version(self) -> int:
        return self.version

    # ------------------------------------------------------------------ weight publishing (async)
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def publish_weights(
        self, version: int, transport: str, weight_dir: str | None = None, proximal: bool = False
    ) -> Parcel | None:
        """The actor's weights for the rollout as version ``version`` (with ``proximal`` the ones kept
        by ``keep_proximal_weights``), sent by ``transport`` (``async_training.weight_transport``;
        ``weight_dir`` for files): every rank takes part in the gather, rank 0 returns the parcel,
        the others None."""
        self.version = version
        return self.weight_sync.publish(version, transport, weight_dir, proximal, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self, parcel: Parcel, keep_from: int | None = None) -> None:
        """Published weights. Without ``keep_from`` they replace the old ones as a whole between two
        decoding steps, even mid-generation; with it they are kept by version until a batch asks for
        them (versions older than ``keep_from`` go)."""
        self.weight_sync.receive(parcel, keep_from)
        self.version = parcel.version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def keep_proximal_weights(self) -> None:
        """Keep a copy of this rank's actor parameters as they are now (the weights just published to the
        rollout): ``compute_log_prob`` uses it for a batch whose ``meta_info["proximal_weights"]`` is
        set (verl's ``async_training.compute_prox_log_prob``); in host memory under ``param_offload``."""
        self.weight_sync.keep_proximal()

    # ------------------------------------------------------------------ log-probs
    def _entropy_options(self) -> EntropyOptions:
        cfg = self.config.actor
        chunk = cfg.entropy_from_logits_chunk_size if cfg.entropy_from_logits_with_chunking else None
        return EntropyOptions(
            chunk_size=chunk, checkpointing=cfg.entropy_checkpointing, metric_only=cfg.entropy_coeff == 0
        )

    def _log_probs(
        self,
        engine: TrainEngine,
        data: DataProto,
        micro: int | None,
        dynamic: bool,
        max_tokens: int,
        entropy: bool,
        sum_pi_squared: bool = False,
        topk: int | None = None,
    ):
        temperature = data.meta_info.get("temperature", self.config.rollout.temperature)
        data = ulysses.gather_group_batch(data, self.rows_group)
        max_tokens *= self.sp_size  # a rank holds 1/sp of each micro-batch's tokens
        micro_batches, groups = split_micro_batches(data, POLICY_INPUT_KEYS, micro, dynamic, max_tokens)
        options = self._entropy_options() if entropy else None
        packed = self.config.model.use_remove_padding and engine.packs_sequences
        with ulysses.sequence_parallel(self.sp_group):
            outs = engine.infer(
                micro_batches,
                lambda m, b: response_log_probs(m, b, temperature, options, sum_pi_squared, packed, topk),
            )
        out = DataProto.from_dict({key: restore_order([o[key] for o in outs], groups) for key in outs[0]})
        return dict(ulysses.own_share(out, self.rows_group).batch.items())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` of the responses under the current actor (and
        ``sum_pi_squared`` with ``actor.calculate_sum_pi_squared``), or under the weights kept by
        ``keep_proximal_weights`` when the batch asks for them."""
        cfg = self.config.rollout
        args = (
            self.actor,
            data,
            cfg.log_prob_micro_batch_size_per_gpu,
            cfg.log_prob_use_dynamic_bsz,
            cfg.log_prob_max_token_len_per_gpu,
            True,
            self.config.actor.calculate_sum_pi_squared,
        )
        if data.meta_info.get("proximal_weights"):
            with self.actor.computing_with(self.weight_sync.proximal_weights):
                out = self._log_probs(*args)
        else:
            out = self._log_probs(*args)
        out["old_log_probs"] = out.pop("log_probs")
        return DataProto.from_dict(out)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` of the responses under the frozen reference policy."""
        cfg = self.config.ref
        args = (
            data,
            cfg.log_prob_micro_batch_size_per_gpu,
            cfg.log_prob_use_dynamic_bsz,
            cfg.log_prob_max_token_len_per_gpu,
        )
        if self.ref is None:  # LoRA: the reference is the base model, i.e. the actor without its adapters
            with self.actor.disabled_adapter():
                out = self._log_probs(self.actor, *args, False)
        else:
            out = self._log_probs(self.ref, *args, False)
        return DataProto.from_dict({"ref_log_prob": out["log_probs"]})

    # ------------------------------------------------------------------ training
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO epochs over the batch, then one LR-schedule step (the driver then calls
        :meth:`update_weights`: the weight sync is a phase of its own)."""
        cfg = self.config.actor
        temperature = data.meta_info.get("temperature", self.config.rollout.temperature)
        # on-policy (the driver skipped the old-log-prob pass): this forward gives old_log_probs,
        # and the entropy metric that pass would have reported
        on_policy = "old_log_probs" not in data.batch.keys()
        entropy = self._entropy_options() if cfg.entropy_coeff != 0 or on_policy else None
        packed = self.config.model.use_remove_padding and self.actor.packs_sequences
        loss_fn = ActorLoss(cfg, self.distillation, temperature, entropy, packed, on_policy, self.sp_size)
        dp_size = self.world_size // self.replicas  # a group holding the same rows is one data-parallel rank
        spec = actor_update_spec(cfg, self.config.rollout.n, dp_size, self.replicas, self.sp_size)
        keys = POLICY_INPUT_KEYS + [k for k in ACTOR_LOSS_KEYS if k in data.batch.keys()]
        start = time.perf_counter()
        data = ulysses.gather_group_batch(data, self.rows_group)
        with ulysses.sequence_parallel(self.sp_group):
            metrics = run_ppo_updates(self.actor, data, keys, spec, loss_fn, self.shuffle_generator)
        seconds = time.perf_counter() - start
        metrics.update(update_perf_metrics(self.actor, data, seconds, self.device, cfg.ppo_epochs))
        metrics.update(loss_fn.gap.over_ranks().metrics() if on_policy else {})
        metrics["lr"] = self.actor.lr_scheduler_step()
        first = data.batch["attention_mask"][0].bool()
        self.last_sequence = data.batch["input_ids"][0][first].tolist()
        self.rollout_behind = self.is_rollout
        return DataProto(meta_info={"metrics": prefixed(metrics, "actor")})

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, folder: str) -> None:
        """Write the actor's shard (model, optimizer, LR schedule), this rank's RNG states and,
        from rank 0, ``huggingface/`` (config + tokenizer; + weights if ``hf_model`` is asked)."""
        contents = self.config.actor.checkpoint.save_contents
        os.makedirs(folder, exist_ok=True)
        self.actor.save(folder, contents)
        state = {
            "version": self.version,
            "shuffle_generator": self.shuffle_generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.rollout is not None:
            state["rollout"] = self.rollout.state_dict()
        torch.save(state, os.path.join(folder, f"worker_rank_{self.rank}.pt"))
        full = self.actor.full_model_state_dict_on_cpu() if "hf_model" in contents else None
        adapter = None
        if self.actor.lora:
            adapter = (self.actor.adapter_config(), self.actor.adapter_state_dict_on_cpu())
        if self.rank == 0:
            target = os.path.join(folder, "huggingface")
            processor = self.config.model.path  # a vision model's image processor goes with it
            save_hf_files(
                self.actor.hf_module, self.tokenizer, target, full, adapter, processor_from=processor
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, folder: str) -> None:
        self.actor.load(folder, self.config.actor.checkpoint.load_contents)
        path = os.path.join(folder, f"worker_rank_{self.rank}.pt")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is missing: the checkpoint was written by fewer ranks than this run has "
                f"({self.world_size}); exact resume needs the same number of ranks"
            )
        state = torch_load(path)  # a corrupt file: an error naming it, its step and how to resume
        self.shuffle_generator.set_state(state["shuffle_generator"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        if self.rollout is not None:
            self.rollout.load_state_dict(state["rollout"])
            self.update_weights(state["version"])
        self.version = state["version"]
