"""The ``distillation`` section: on-policy distillation from one or more teacher models (verl's keys).

The student samples as usual; a frozen teacher scores the sampled tokens and the actor's loss adds
a per-token divergence from the teacher (``distillation_loss.loss_mode``), as a supervised loss or,
with ``use_policy_gradient``, as a negative reward in a clipped policy-gradient loss. The math is in
:mod:`verl.algorithms.distillation`; the teacher's worker in :mod:`verl.workers.teacher`.

Teachers live on a pool of their own, ``nnodes x n_gpus_per_node`` processes, as in verl. One entry
(``teacher_models.teacher_model``) takes the whole pool; several split it by ``num_replicas x``
the replica size of their ``inference`` section and take the samples whose ``teacher_key`` column
(``data_source`` by default) equals their ``key``. Here a teacher scores with the reference's engine
(``actor_rollout_ref.ref.*``: FSDP or Megatron) over its share of the pool, not with a served
inference engine, so the rest of ``inference.*`` has no effect (noted at start-up).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from verl.config.base import (
    NON_NEGATIVE,
    POSITIVE,
    BaseConfig,
    ConfigError,
    Range,
    at_least,
    check,
    check_choice,
    check_ranges,
    ranged,
)

ESTIMATOR_LOSSES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""Single-sample estimators of KL(student || teacher) at the sampled token (:func:`verl.algorithms.kl.kl_penalty`)."""
TOPK_LOSSES = ("forward_kl_topk",)
"""KL(teacher || student) over the teacher's top-k tokens at each position."""
DEFAULT_TEACHER = "teacher_model"
"""The entry of the single-teacher setup; popped when other entries are given, as in verl."""
REPLICA_KEYS = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
"""The keys of ``inference`` whose product is one replica's number of processes (verl's rule)."""


def default_inference() -> dict[str, Any]:
    """verl's defaults of ``teacher_models.<name>.inference`` (its teacher's inference engine), so a
    script's overrides of them resolve; only the replica size (:data:`REPLICA_KEYS`) is read here."""
    return {
        "name": None,
        "dtype": None,
        "gpu_memory_utilization": 0.5,
        "enforce_eager": True,
        "cudagraph_capture_sizes": None,
        "free_cache_engine": True,
        "data_parallel_size": 1,
        "expert_parallel_size": 1,
        "tensor_model_parallel_size": 2,
        "max_num_batched_tokens": 8192,
        "max_model_len": None,
        "max_num_seqs": 1024,
        "load_format": "auto",
        "engine_kwargs": {},
        "limit_images": None,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "disable_log_stats": True,
        "skip_tokenizer_init": True,
        "prompt_length": None,
        "response_length": None,
        "temperature": None,
    }


@dataclass
class DistillationLossConfig(BaseConfig):
    loss_mode: str = "k3"
    """An estimator of KL(student || teacher) at the sampled token (kl/k1, abs, mse/k2, low_var_kl/k3),
    or forward_kl_topk: KL(teacher || student) over the teacher's top-k tokens."""
    topk: int | None = ranged(32, at_least(1))
    """k of forward_kl_topk (the teacher returns its k most likely tokens per position)."""
    use_task_rewards: bool = True
    """Keep the policy-gradient loss of the task's rewards and add the distillation loss (times
    distillation_loss_coef); False trains on the distillation loss alone."""
    distillation_loss_coef: float = ranged(1.0, NON_NEGATIVE)
    """Weight of the distillation loss next to the task's loss (use_task_rewards=True only)."""
    loss_max_clamp: float | None = ranged(None, POSITIVE)
    """Clamp the per-token distillation loss to [-v, v] (null: no clamp)."""
    log_prob_min_clamp: float | None = ranged(None, Range(high=0.0))
    """forward_kl_topk: clamp both sides' top-k log-probs from below (null: no clamp)."""
    use_policy_gradient: bool = False
    """The negative per-token loss is the advantage of a clipped policy-gradient loss (on-policy
    distillation as a reward); False back-propagates the loss itself."""
    policy_loss_mode: str = "vanilla"
    """The policy loss of use_policy_gradient; only vanilla, as in verl."""
    clip_ratio: float = ranged(0.2, NON_NEGATIVE)
    """Clip range of that policy loss."""
    clip_ratio_low: float = ranged(0.2, NON_NEGATIVE)
    """Its lower clip range."""
    clip_ratio_high: float = ranged(0.2, NON_NEGATIVE)
    """Its upper clip range."""

    @property
    def uses_topk(self) -> bool:
        return self.loss_mode in TOPK_LOSSES

    def validate(self, path: str) -> None:
        check_choice(self.loss_mode, ESTIMATOR_LOSSES + TOPK_LOSSES, f"{path}.loss_mode")
        check_choice(self.policy_loss_mode, ("vanilla",), f"{path}.policy_loss_mode")
        check(
            self.use_policy_gradient or self.loss_mode not in ("k1", "kl"),
            f"{path}.loss_mode",
            "an estimator other than k1/kl with use_policy_gradient=False (the gradient of k1 does not "
            "depend on the teacher's log-probs; use k3, or use_policy_gradient=True)",
            self.loss_mode,
        )
        check(
            not self.uses_topk or self.topk is not None,
            f"{path}.topk",
            "at least 1 for forward_kl_topk",
            None,
        )


@dataclass
class TeacherModelConfig(BaseConfig):
    key: str | None = None
    """The teacher_key value of the samples this teacher scores (required with several teachers)."""
    model_path: str | None = None
    """The teacher's Hugging Face folder; it must share the student's tokenizer."""
    num_replicas: int | None = ranged(0, NON_NEGATIVE)
    """Replicas of this teacher (several teachers): its share of the pool is num_replicas x replica size."""
    inference: dict[str, Any] = field(default_factory=default_inference)
    """verl's inference-engine settings of the teacher; here only the replica size is read."""

    @property
    def replica_size(self) -> int:
        size = 1
        for key in REPLICA_KEYS:
            size *= int(self.inference.get(key) or 1)
        return size


@dataclass
class DistillationConfig(BaseConfig):
    enabled: bool = False
    """Distil from the teacher(s) below while training."""
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    """The loss and how it combines with the task's."""
    n_gpus_per_node: int = ranged(8, NON_NEGATIVE)
    """Processes (devices) per node of the teachers' pool."""
    nnodes: int = ranged(0, NON_NEGATIVE)
    """Nodes of the teachers' pool (at least 1 when enabled)."""
    teacher_models: dict[str, Any] = field(
        default_factory=lambda: {DEFAULT_TEACHER: asdict(TeacherModelConfig())}
    )
    """The teachers by entry name, each with a teacher's keys (:class:`TeacherModelConfig`; a plain
    dict so that ``+distillation.teacher_models.<name>.<key>=...`` can add one); see the module doc."""
    teacher_key: str = "data_source"
    """The column that routes a sample to the teacher whose key it holds (several teachers)."""

    def validate(self, path: str) -> None:
        if not self.enabled:
            return
        self.distillation_loss.validate(f"{path}.distillation_loss")
        check(
            self.nnodes >= 1, f"{path}.nnodes", "at least 1 with distillation.enabled (the teachers' pool)", 0
        )
        check(self.n_gpus_per_node >= 1, f"{path}.n_gpus_per_node", "at least 1 with distillation.enabled", 0)
        teacher_plan(self, path)

    @property
    def pool_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


@dataclass(frozen=True)
class TeacherPlacement:
    """One teacher as it will run: its routing key, model and number of processes."""

    key: str
    """The teacher_key value it scores (``default`` for a single teacher)."""
    model_path: str
    """Its Hugging Face folder."""
    processes: int
    """Its share of the teachers' pool."""
    path_key: str
    """The config key of ``model_path`` (``distillation.teacher_models.<name>.model_path``), for errors."""


def teacher_plan(config: DistillationConfig, path: str = "distillation") -> list[TeacherPlacement]:
    """The teachers and their shares of the pool, in entry order (verl's rules): one entry takes the
    whole pool, in whole replicas, under the key ``default``; with several, ``teacher_model`` is
    dropped and each names its key, model and replicas, which must fill the pool exactly."""
    entries = teacher_entries(config, path)
    if len(entries) > 1:
        entries.pop(DEFAULT_TEACHER, None)
    single = len(entries) == 1
    plan = []
    for name, teacher in entries.items():
        key = f"{path}.teacher_models.{name}"
        check(teacher.model_path is not None, f"{key}.model_path", "the teacher's model folder", None)
        if single:
            replicas, remainder = divmod(config.pool_size, teacher.replica_size)
            check(
                remainder == 0 and replicas >= 1,
                f"{key}.inference.tensor_model_parallel_size",
                f"a replica size dividing the teachers' pool of {config.pool_size} processes "
                f"({path}.nnodes x n_gpus_per_node)",
                teacher.replica_size,
            )
            plan.append(
                TeacherPlacement(
                    teacher.key or "default", teacher.model_path, config.pool_size, f"{key}.model_path"
                )
            )
            continue
        check(teacher.key is not None, f"{key}.key", f"the {path}.teacher_key value it scores", None)
        check(bool(teacher.num_replicas), f"{key}.num_replicas", "at least 1 with several teachers", 0)
        plan.append(
            TeacherPlacement(
                teacher.key,
                teacher.model_path,
                teacher.num_replicas * teacher.replica_size,
                f"{key}.model_path",
            )
        )
    keys = [p.key for p in plan]
    if len(set(keys)) != len(keys):
        raise ConfigError(
            f"{path}.teacher_models: two teachers share a key ({keys}); each key routes one teacher"
        )
    total = sum(p.processes for p in plan)
    check(
        total == config.pool_size,
        f"{path}.teacher_models",
        f"teachers filling the pool of {config.pool_size} processes ({path}.nnodes x n_gpus_per_node) "
        "with num_replicas x replica size",
        f"{total} processes",
    )
    return plan


def check_distillation(config: Any) -> None:
    """What the section needs from the rest of the root config: forward_kl_topk reads whole-vocabulary
    distributions, which the Megatron engine (vocabulary split over tensor-parallel ranks) does not
    gather here."""
    distill = config.distillation
    if not (distill.enabled and distill.distillation_loss.uses_topk):
        return
    policy = config.actor_rollout_ref
    for role in ("actor", "ref"):
        check(
            getattr(policy, role).strategy != "megatron",
            f"actor_rollout_ref.{role}.strategy",
            "fsdp/fsdp2 with distillation.distillation_loss.loss_mode=forward_kl_topk (top-k over a "
            "vocabulary split by Megatron is not implemented; use an estimator such as k3)",
            "megatron",
        )


def teacher_entries(config: DistillationConfig, path: str = "distillation") -> dict[str, TeacherModelConfig]:
    """``teacher_models`` as typed entries; a key a teacher does not have is refused by name."""
    known = {f.name for f in fields(TeacherModelConfig)}
    entries = {}
    for name, values in config.teacher_models.items():
        values = dict(values or {})
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"{path}.teacher_models.{name}.{unknown[0]}: not a teacher's key; expected one of {sorted(known)}"
            )
        inference = {**default_inference(), **dict(values.pop("inference", None) or {})}
        teacher = TeacherModelConfig(**values, inference=inference)
        check_ranges(teacher, f"{path}.teacher_models.{name}")
        entries[name] = teacher
    return entries


def distillation_inert_keys(config: DistillationConfig) -> list[str]:
    """Keys of the section that have no effect: all of it when disabled, else each teacher's
    inference engine settings (the teacher scores with the reference's engine)."""
    if not config.enabled:
        return ["distillation"]
    unread = [key for key in default_inference() if key not in REPLICA_KEYS]
    return [
        f"distillation.teacher_models.{name}.inference.{key}"
        for name in config.teacher_models
        for key in unread
    ]
