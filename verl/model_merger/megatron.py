"""Merge the per-rank shards of a Megatron checkpoint into one safetensors Hugging Face directory.

Every rank of the run wrote ``megatron_rank_{rank}.pt`` with its ``layout`` (tensor- and
pipeline-parallel position, data-parallel rank) and its ``GPTModel`` shard under megatron's names;
the checkpoint's ``huggingface/`` folder holds the model config and tokenizer (written by rank 0).
Data-parallel ranks hold copies, so the shards of data-parallel rank 0 are the whole model: each
parameter is put together from its tensor-parallel slices, its layer renumbered from the stage's
count to the model's (stage ``p`` of ``P`` holds layers ``p * L/P ...``: the engine refuses uneven
stages), and converted by the same layout functions the engine loads and exports with
(:mod:`verl.workers.engine.megatron.weights`). Plain tensor work in one process: no process
group, no GPU, no megatron-core.
"""

from __future__ import annotations

import glob
import json
import os
import re

import torch

from verl.model_merger.fsdp import _auto_class, checkpoint_folders, export_dtype
from verl.utils.checkpoint_io import read_error
from verl.utils.model import save_hf_files
from verl.workers.engine.lora import ADAPTER_DIR

SHARD_PATTERN = re.compile(r"megatron_rank_(\d+)\.pt$")


def merge_megatron_checkpoint(local_dir: str, target_dir: str, dtype: str = "float32") -> str:
    """Write ``target_dir`` (config, tokenizer, ``model.safetensors``); returns its path."""
    from transformers import AutoConfig, AutoTokenizer

    from verl.workers.engine.megatron.weights import megatron_to_hf

    local_dir, hf_dir = checkpoint_folders(local_dir)
    torch_dtype = export_dtype(dtype)
    config = AutoConfig.from_pretrained(hf_dir)
    shards, experts = read_shards(local_dir)
    shards, experts = fold_lora(shards, hf_dir), fold_lora(experts, hf_dir)
    value_head = _value_head(config, shards)
    full = full_megatron_state(shards, config, value_head, experts)
    state = {k: t.to(torch_dtype).contiguous() for k, t in megatron_to_hf(full, config, value_head).items()}
    if config.tie_word_embeddings and not value_head:  # the cast made two tensors: one, as transformers
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with torch.device("meta"):  # the class and config only: the weights are the merged tensors
        model = _auto_class(config).from_config(config, dtype=torch_dtype)
    model.load_state_dict(state, strict=True, assign=True)
    save_hf_files(model, AutoTokenizer.from_pretrained(hf_dir), target_dir, state)
    return os.path.abspath(target_dir)


Shards = dict[tuple[int, int], tuple[str, dict[str, torch.Tensor]]]


def read_shards(local_dir: str) -> tuple[Shards, Shards]:
    """``{(tp_rank, pp_rank): (file, model shard)}`` of data-parallel rank 0, every position present,
    and ``{(ep_rank, pp_rank): (file, model shard)}``: where each expert-parallel rank's experts are
    (megatron-core takes expert parallelism from the data-parallel ranks). Files are memory-mapped,
    so the optimizer states next to the shards cost no memory."""
    files = sorted(
        (int(m.group(1)), path)
        for path in glob.glob(os.path.join(local_dir, "megatron_rank_*.pt"))
        if (m := SHARD_PATTERN.search(path))
    )
    if not files:
        hint = (
            "; it holds a DCP (FSDP) checkpoint: use --backend fsdp"
            if os.path.isfile(os.path.join(local_dir, ".metadata"))
            else ""
        )
        raise FileNotFoundError(f"{local_dir} has no megatron_rank_*.pt files{hint}")
    shards, experts, sizes = {}, {}, set()
    for _, path in files:
        state = _load(path)
        layout = state["layout"]
        sizes.add((layout["tp_size"], layout["pp_size"]))
        if "model" not in state:
            raise KeyError(f"{path} holds no model (saved without 'model' in checkpoint.save_contents)")
        if layout.get("etp_rank", 0) == 0:  # checkpoints of dense-only versions have no expert keys
            experts.setdefault((layout.get("ep_rank", 0), layout["pp_rank"]), (path, state["model"]))
        if layout["dp_rank"] == 0:  # the other data-parallel ranks hold copies (experts aside)
            shards[(layout["tp_rank"], layout["pp_rank"])] = (path, state["model"])
    if len(sizes) != 1:
        raise ValueError(f"{local_dir}: the rank files disagree on (tp_size, pp_size): {sorted(sizes)}")
    _check_complete(local_dir, shards, *sizes.pop())
    return shards, experts


def fold_lora(shards: Shards, hf_dir: str) -> Shards:
    """The shards with a LoRA run's adapters folded into their linears: ``W + s B A`` on each
    tensor-parallel slice (``linear.lora.lora_A`` / ``lora_B`` next to ``linear.weight``, sliced as
    the engine slices them), ``s`` from the run's ``huggingface/lora_adapter/adapter_config.json``."""
    suffix = ".lora.lora_A"
    if not any(k.endswith(suffix) for _, state in shards.values() for k in state):
        return shards
    config_path = os.path.join(hf_dir, ADAPTER_DIR, "adapter_config.json")
    if not os.path.isfile(config_path):
        raise ValueError(
            f"the shards hold LoRA adapters but {config_path} (their rank and alpha) is missing: the "
            "checkpoint is incomplete, cannot fold the adapters in"
        )
    with open(config_path) as f:
        saved = json.load(f)
    scaling = saved["lora_alpha"] / (saved["r"] ** 0.5 if saved.get("use_rslora") else saved["r"])
    out = {}
    for position, (path, state) in shards.items():
        folded = {k: t for k, t in state.items() if ".lora.lora_" not in k}
        for key in (k for k in state if k.endswith(suffix)):
            linear = key.removesuffix(suffix)
            weight, a, b = state[f"{linear}.weight"], state[key], state[f"{linear}.lora.lora_B"]
            folded[f"{linear}.weight"] = (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)
        out[position] = (path, folded)
    return out


def _load(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as error:  # unpickling raises many types
        raise read_error(path, error) from error


def _check_complete(local_dir: str, shards: dict, tp: int, pp: int) -> None:
    """Every (tp_rank, pp_rank) of data-parallel rank 0 present; the error names the files that
    megatron-core's default rank order (tensor fastest, then data, then pipeline) puts there."""
    missing = [(t, p) for p in range(pp) for t in range(tp) if (t, p) not in shards]
    if not missing:
        return
    found = sorted(os.path.basename(path) for path, _ in shards.values())
    dp = max(1, len(glob.glob(os.path.join(local_dir, "megatron_rank_*.pt"))) // (tp * pp))
    names = [f"megatron_rank_{t + tp * dp * p}.pt (tp_rank={t}, pp_rank={p})" for t, p in missing]
    raise FileNotFoundError(
        f"{local_dir}: the checkpoint (tp={tp}, pp={pp}) lacks the shards of data-parallel rank 0 at "
        f"{', '.join(names)}; found {found}"
    )


def _value_head(config, shards: dict) -> bool:
    """Whether the shards are a critic's (a one-row output layer on the last stage): the shards
    decide, not ``config.json``, which may name the causal LM the critic started from. A critic's
    config is set to the one-label token classifier the engine converts (with or without bias)."""
    if any(a.endswith("SequenceClassification") for a in getattr(config, "architectures", None) or []):
        raise ValueError("a sequence classifier (reward model) is not trained by the Megatron engine")
    pp = 1 + max(p for _, p in shards)
    _, last = shards[(0, pp - 1)]
    weight = last.get("output_layer.weight")
    if weight is None or weight.shape[0] != 1:
        return False
    config.num_labels, config.classifier_dropout = 1, 0.0
    config.token_classification_bias = "output_layer.bias" in last
    config.architectures = [type(config).__name__.removesuffix("Config") + "ForTokenClassification"]
    return True


def full_megatron_state(
    shards: Shards, hf_config, value_head: bool, experts: Shards
) -> dict[str, torch.Tensor]:
    """Full megatron tensors under their one-stage names (global layer numbers), gathered from the
    tensor-parallel slices of the stage that holds each; a MoE layer's experts from every
    expert-parallel rank's local experts."""
    from verl.workers.engine.megatron.weights import FIRST, LAST, slots, unshard

    tp = 1 + max(t for t, _ in shards)
    pp = 1 + max(p for _, p in shards)
    if hf_config.num_hidden_layers % pp:
        raise ValueError(
            f"{pp} pipeline stages do not divide the model's {hf_config.num_hidden_layers} layers"
        )
    per_stage = hf_config.num_hidden_layers // pp
    full = {}
    for slot in slots(hf_config, value_head, tp):
        if not slot.export:
            continue  # a tied output layer: the embedding's tensor
        stage = {FIRST: 0, LAST: pp - 1}.get(slot.layer) if slot.layer < 0 else slot.layer // per_stage
        if slot.experts:
            full[slot.local_name(0)] = _expert_stack(slot, experts, stage, stage * per_stage)
            continue
        local = slot.local_name(stage * per_stage)
        pieces = []
        for t in range(tp):
            path, model = shards[(t, stage)]
            if local not in model:
                raise KeyError(f"{path} has no {local!r} (expected on pipeline stage {stage} of {pp})")
            pieces.append(model[local])
        full[slot.local_name(0)] = unshard(slot, pieces)
    return full


def _expert_stack(slot, experts: Shards, stage: int, offset: int) -> torch.Tensor:
    """An experts slot's ``[E, ...]`` tensor: each expert-parallel rank's local experts, in rank order."""
    ranks = sorted(ep for ep, pp in experts if pp == stage)
    if ranks != list(range(len(ranks))) or slot.experts % len(ranks):
        found = sorted(os.path.basename(path) for path, _ in experts.values())
        raise FileNotFoundError(
            f"the experts of pipeline stage {stage} need every expert-parallel rank's file; found the ranks "
            f"{ranks} in {found}"
        )
    per_rank = slot.experts // len(ranks)
    stacks = []
    for ep in ranks:
        path, model = experts[(ep, stage)]
        names = [slot.expert_name(offset, i) for i in range(per_rank)]
        absent = [n for n in names if n not in model]
        if absent:
            raise KeyError(f"{path} has no {absent[0]!r} (expert-parallel rank {ep}, pipeline stage {stage})")
        stacks += [model[n] for n in names]
    return torch.stack(stacks)
