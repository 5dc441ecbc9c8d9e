"""megatron-core distributed checkpoints of a model's weights (``megatron.use_dist_checkpointing``).

A distributed checkpoint (megatron-core's ``dist_checkpointing``, the ``torch_dist`` format) stores
each parameter once as a *global* tensor, with the slices every rank wrote; a load asks for this
rank's slice of each global tensor, so a checkpoint written at one tensor / pipeline layout loads at
any other. verl starts large models from one (``use_dist_checkpointing=True``,
``dist_checkpointing_path``), written beforehand by ``scripts/converter_hf_to_mcore.py``:

* :func:`convert_hf_to_dist_checkpoint` builds the model on the calling ranks, fills it from a Hugging
  Face folder with this project's converter (:func:`.weights.load_hf_state`) and saves it;
* :func:`load_dist_checkpoint` fills a model the engine has built from such a checkpoint.

The keys are megatron-core's Transformer Engine names (its local layer spec maps the separate norms
onto them, ``input_layernorm`` -> ``self_attention.linear_qkv.layer_norm_weight``), those of verl's
own converter too; TE's ``_extra_state`` entries hold no weights and are not asked for.

The padded vocabulary rows (tensor parallelism rounds the vocabulary up, see :mod:`.arch`) differ
between layouts: megatron-core marks the embedding and output layer ``allow_shape_mismatch``, so a
load fills the extra rows with zeros or drops the surplus ones, which are padding either way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from verl.config.base import ConfigError
from verl.workers.engine.megatron.arch import ValueHead

OUTPUT_LAYER = "output_layer."
EXTRA_STATE = "_extra_state"


def _value_head_from_hf(model: nn.Module, hf_state: Mapping[str, torch.Tensor]) -> None:
    """The critic's head is not in a causal LM's checkpoint: it comes from the HF module (its
    ``score`` weights, as without ``use_dist_checkpointing``)."""
    from verl.workers.engine.megatron.weights import SCORE

    head = model.output_layer
    with torch.no_grad():
        head.weight.copy_(hf_state[f"{SCORE}.weight"])
        if head.bias is not None:
            head.bias.copy_(hf_state[f"{SCORE}.bias"])


def _first_failure(error: BaseException) -> str:
    """The first rank's own error of a torch.distributed.checkpoint failure (which lists every rank's
    traceback), else ``error`` itself."""
    failures = getattr(error, "failures", None)
    if failures:
        first, _ = next(iter(failures.values()))
        return f"{type(first).__name__}: {first}"
    return f"{type(error).__name__}: {error}"


def _mismatch(missing: set[str], unexpected: set[str]) -> str:
    """The keys every rank found wrong, in words ('' when none): what a rank lacks may differ per rank,
    so the lists are gathered and every rank raises the same error (none waits on the others)."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(unexpected))
    lacking = sorted({k for keys in gathered for k in keys})
    parts = []
    if lacking:
        parts.append(f"lacks {len(lacking)} tensors of this model, e.g. {lacking[:3]}")
    if missing:
        parts.append(f"holds {len(missing)} tensors this model has not, e.g. {sorted(missing)[:3]}")
    return "; ".join(parts)


def load_dist_checkpoint(
    model: nn.Module,
    path: str | None,
    key: str,
    prefix: str = "",
    hf_state: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Overwrite every weight of ``model`` (this rank's ``GPTModel`` stage) with its slice of the
    distributed checkpoint at ``path``, whose keys carry ``prefix`` (verl's
    ``dist_checkpointing_prefix``). ``key`` names the config section in errors. A critic's value
    head (:class:`~.arch.ValueHead`) is taken from ``hf_state`` instead. Every rank calls this.

    Raises :class:`ConfigError` naming ``key`` and ``path`` (on every rank) when the path holds no
    distributed checkpoint, or one of another model: a tensor missing on either side or of another
    shape."""
    from torch.distributed.checkpoint.api import CheckpointException

    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    where = f"{key}.dist_checkpointing_path={path!r}"
    if not path or not os.path.isdir(path):
        raise ConfigError(f"{where}: expected the folder of a megatron-core distributed checkpoint")
    if not dist_checkpointing.check_is_distributed_checkpoint(path):
        raise ConfigError(
            f"{where}: no megatron-core distributed checkpoint there (no metadata.json); write one with "
            "scripts/converter_hf_to_mcore.py"
        )
    sharded = model.sharded_state_dict(prefix=prefix)
    value_head = model.post_process and isinstance(model.output_layer, ValueHead)
    if value_head:
        sharded = {k: v for k, v in sharded.items() if not v.key.startswith(prefix + OUTPUT_LAYER)}
    try:
        # RETURN_ALL: the load skips what the checkpoint lacks, and the mismatches are reported below
        _, missing, unexpected = dist_checkpointing.load(sharded, path, strict=StrictHandling.RETURN_ALL)
    except (Exception, CheckpointException) as error:  # the latter is a BaseException, raised on every rank
        raise ConfigError(
            f"{where} (dist_checkpointing_prefix={prefix!r}) does not fit this model: {_first_failure(error)}"
        ) from error
    # Transformer Engine's per-layer metadata (verl's own converter builds TE layers) holds no weights;
    # a causal LM's output layer is what a critic replaces
    skip = (prefix + OUTPUT_LAYER,) if value_head else ()
    missing = {k for k in missing if EXTRA_STATE not in k and not k.startswith(skip)}
    wrong = _mismatch(missing, unexpected)
    if wrong:
        raise ConfigError(
            f"{where} (dist_checkpointing_prefix={prefix!r}) does not fit this model: it {wrong}"
        )
    if value_head:
        _value_head_from_hf(model, hf_state)


def save_dist_checkpoint(model: nn.Module, output_path: str) -> None:
    """Save ``model``'s weights (every rank's stage) as a distributed checkpoint at ``output_path``,
    atomically: the ranks write into ``<output_path>.partial``, which rank 0 renames once all are
    done. Refuses an ``output_path`` that exists. Every rank calls this."""
    from megatron.core import dist_checkpointing

    partial = output_path.rstrip("/") + ".partial"
    if os.path.exists(output_path):
        raise FileExistsError(f"--output_path {output_path} exists; remove it or choose another folder")
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)  # a crashed earlier run's
        os.makedirs(partial)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), partial)
    dist.barrier()
    if dist.get_rank() == 0:
        os.rename(partial, output_path)
    dist.barrier()


def build_stage(hf_config, tp: int, pp: int, dtype: torch.dtype, use_cpu_initialization: bool = False):
    """This rank's ``GPTModel`` stage of ``hf_config`` (a causal LM) at ``tp`` x ``pp``, as the engine
    builds it; megatron-core's groups must exist."""
    from megatron.core import parallel_state as ps
    from verl.workers.engine.megatron.arch import build_model, transformer_config

    config = transformer_config(hf_config, tp=tp, pp=pp, dtype=dtype)
    config.use_cpu_initialization = config.use_cpu_initialization or use_cpu_initialization
    return build_model(
        hf_config,
        config,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
    )


def convert_hf_to_dist_checkpoint(
    hf_model_path: str,
    output_path: str,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    device: torch.device | None = None,
    use_cpu_initialization: bool = False,
    trust_remote_code: bool = False,
) -> nn.Module:
    """Write the Hugging Face causal LM at ``hf_model_path`` as a distributed checkpoint at
    ``output_path`` (atomically, see :func:`save_dist_checkpoint`), split ``tp`` x ``pp`` (expert
    parallel ``ep``) over the calling ranks, in the weights' stored dtype. Every rank of the
    (initialised) process group calls this; returns this rank's stage."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.arch import check_parallel
    from verl.workers.engine.megatron.groups import check_device, init_model_parallel
    from verl.workers.engine.megatron.weights import load_hf_state

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device, "converter_hf_to_mcore")
    hf_config = AutoConfig.from_pretrained(hf_model_path, trust_remote_code=trust_remote_code)
    check_parallel(hf_config, tp, pp, key="converter_hf_to_mcore", ep=ep)
    sizes = MegatronConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
    )
    init_model_parallel(sizes, "converter_hf_to_mcore (--tp_size, --pp_size, --ep_size)")
    hf_model = AutoModelForCausalLM.from_pretrained(
        hf_model_path, torch_dtype="auto", trust_remote_code=trust_remote_code
    )
    model = build_stage(hf_config, tp, pp, hf_model.dtype, use_cpu_initialization)
    load_hf_state(model, hf_config, hf_model.state_dict())
    del hf_model
    save_dist_checkpoint(model.to(device), output_path)
    return model
