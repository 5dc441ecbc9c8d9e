"""What a PPO run needs from its machine and from the model folders it names, checked at start-up.

A mistake found here is one line naming the key to change (``Error in the config: ...``), in seconds,
instead of a worker's traceback once Ray has started and the models are placed:

* the teachers of on-policy distillation: each ``distillation.teacher_models.<name>.model_path`` is a
  model folder (or a hub id) that reads the student's token ids as the student does (a teacher scores
  the student's token ids; verl, like this project, maps no tokens between vocabularies);
* the Megatron engine needs CUDA (megatron-core calls it even for CPU tensors): a Megatron role on a
  machine, or a Ray cluster, without GPUs is refused.

:func:`check_before_ray` runs before Ray starts; :func:`check_after_ray` checks Megatron again against
the GPUs of the cluster the run joined (``ray_init.address``), before any worker is placed.
"""

from __future__ import annotations

import importlib
import logging
import os

import ray
import torch

from verl.config.base import ConfigError
from verl.config.distillation import TeacherPlacement, teacher_plan
from verl.config.megatron import MEGATRON
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.utils.model import (
    TokenizerSource,
    check_model_dir,
    load_tokenizer,
    load_tokenizer_from,
    resolve_tokenizer_source,
    vocab_size,
)

logger = logging.getLogger(__name__)

CPU_SHIM_ATTRIBUTE = "MEGATRON_CORE_ON_CPU"
"""A model plugin (``model.external_lib``) that makes megatron-core run without CUDA in the workers that
import it (this project's tests bring such a shim) sets this module attribute to True: a run that names
it is then not refused here, and each worker's own check decides (``megatron.groups.check_device``)."""


def check_before_ray(config: PPOTrainerConfig) -> None:
    """The teachers' folders and vocabularies, and Megatron's CUDA when this process starts Ray on this
    machine (a run that joins a cluster is checked by :func:`check_after_ray`)."""
    check_teachers(config)
    if not ray.is_initialized() and config.ray_init.address is None:
        check_megatron_gpus(config, torch.cuda.device_count(), "this machine")


def check_after_ray(config: PPOTrainerConfig) -> None:
    """Megatron's CUDA against the GPUs of the Ray cluster, before any worker is placed."""
    if megatron_roles(config):
        check_megatron_gpus(config, int(ray.cluster_resources().get("GPU", 0)), "the Ray cluster")


def megatron_roles(config: PPOTrainerConfig) -> list[str]:
    """The config keys of the roles that will train or score with the Megatron engine."""
    arr = config.actor_rollout_ref
    roles = {"actor_rollout_ref.actor": arr.actor.strategy}
    if config.use_reference or config.distillation.enabled:  # the teachers run the reference's engine
        roles["actor_rollout_ref.ref"] = arr.ref.strategy
    if config.use_critic:
        roles["critic"] = config.critic.strategy
    return [key for key, strategy in roles.items() if strategy == MEGATRON]


def check_megatron_gpus(config: PPOTrainerConfig, gpus: int, where: str) -> None:
    """Refuse a Megatron role when ``where`` has no GPU, unless the run's model plugin runs megatron-core
    on CPU (:data:`CPU_SHIM_ATTRIBUTE`)."""
    roles = megatron_roles(config)
    if not roles or gpus > 0 or _plugin_runs_megatron_on_cpu(config):
        return
    raise ConfigError(
        f"{roles[0]}.strategy=megatron: the Megatron engine needs an NVIDIA GPU with CUDA (megatron-core "
        f"calls CUDA even for CPU tensors), and {where} has none; on CPU use strategy=fsdp (model_engine=dp)"
    )


def _plugin_runs_megatron_on_cpu(config: PPOTrainerConfig) -> bool:
    libs = {config.actor_rollout_ref.model.external_lib, config.critic.model.external_lib} - {None}
    # Already imported by the config's validation; importing again only looks the module up.
    return any(getattr(importlib.import_module(lib), CPU_SHIM_ATTRIBUTE, False) is True for lib in libs)


def check_teachers(config: PPOTrainerConfig) -> None:
    """Each teacher's ``model_path`` is a model folder (or a hub id), and a local teacher reads the
    student's token ids as the student does (:func:`check_teacher_vocabulary`)."""
    distill = config.distillation
    if not distill.enabled:
        return
    student = resolve_tokenizer_source(
        config.actor_rollout_ref.model, config.data.tokenizer, config.data.trust_remote_code
    )
    student_tokenizer = None
    for teacher in teacher_plan(distill):
        local = check_model_dir(teacher.model_path, teacher.path_key)
        if not (os.path.isdir(local) and os.path.isdir(os.path.expanduser(student.path))):
            continue  # a hub id: read by the workers, which may download it
        student_tokenizer = student_tokenizer or load_tokenizer_from(student)
        check_teacher_vocabulary(config, teacher, local, student, student_tokenizer)


def check_teacher_vocabulary(
    config: PPOTrainerConfig,
    teacher: TeacherPlacement,
    local: str,
    student: TokenizerSource,
    student_tokenizer,
) -> None:
    """A teacher scores the student's token ids: refuse one whose tokenizer gives a student token another
    id (or none), or whose embedding has no row for some student id. A teacher with more tokens or rows
    over the same ids (Qwen2.5-7B's 152064 rows teaching Qwen2.5-0.5B's 151936 in verl's lines) is noted
    once: its extra tokens only take probability mass."""
    named = f"{teacher.path_key}={teacher.model_path!r}"
    the_student = f"the student's tokenizer ({student.key}={student.path!r})"
    vocab = student_tokenizer.get_vocab()
    teacher_tokens = len(vocab)
    if set(os.listdir(local)) & {"tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model"}:
        theirs = load_tokenizer(local, student.trust_remote_code, key=teacher.path_key).get_vocab()
        teacher_tokens = len(theirs)
        moved = [token for token, index in vocab.items() if theirs.get(token) != index]
        if moved:
            token = min(moved, key=vocab.__getitem__)
            raise ConfigError(
                f"{named}: the teacher's tokenizer has {teacher_tokens} tokens and {the_student} {len(vocab)}, "
                f"and {len(moved)} of the student's have another id or none in the teacher's ({token!r}: "
                f"{vocab[token]} -> {theirs.get(token)}); a teacher scores the student's token ids, so it needs "
                "the student's tokenizer (verl maps no tokens between vocabularies)"
            )
    model = config.actor_rollout_ref.model
    rows = vocab_size(local, teacher.path_key, model.trust_remote_code)
    if rows < len(vocab):
        raise ConfigError(
            f"{named}: the teacher's embedding has {rows} rows for the {len(vocab)} tokens of {the_student}; "
            "a teacher scores the student's token ids, so it needs a row for each"
        )
    if not os.path.isdir(os.path.expanduser(model.path)):
        return
    student_rows = vocab_size(model.path, "actor_rollout_ref.model.path", model.trust_remote_code)
    if (teacher_tokens, rows) != (len(vocab), student_rows):
        logger.warning(
            "distillation note: %s has %d tokens and %d embedding rows, the student (%s) %d and %d; the "
            "student's tokens have the same ids in both, so the teacher scores them as its own (its extra "
            "tokens and rows only take probability mass)",
            named,
            teacher_tokens,
            rows,
            model.path,
            len(vocab),
            student_rows,
        )
