"""A Hugging Face model's modules without its weights, for an engine that reads them elsewhere.

With ``megatron.use_dist_checkpointing`` the Megatron engine fills every shard from the distributed
checkpoint and keeps only the HF module's config and class. Reading a large model's safetensors
into host memory on every rank only to drop them again would cost minutes and a full copy of the
model per rank (235B parameters in bf16 are 470 GB), so :func:`weightless` builds the module on the
meta device: nothing read, nothing allocated. A critic's value head, which no causal LM's checkpoint
holds, is the one part made real (:func:`real_head`).
"""

from __future__ import annotations

import json
import os

import torch
from torch import nn

HEAD = "score"
"""transformers' token classifiers keep their head here."""


def weightless(model_class, config, dtype: torch.dtype, trust_remote_code: bool = False) -> nn.Module:
    """``model_class`` (an ``Auto...`` class or a model class) for ``config``, every tensor on the
    meta device."""
    with torch.device("meta"):
        if hasattr(model_class, "from_config"):  # an Auto class
            return model_class.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
        return model_class._from_config(config, dtype=dtype)


def real_head(model: nn.Module, path: str) -> nn.Module:
    """``model``'s value head (``score``) on the CPU: ``path``'s tensors where its checkpoint has them
    (a token classifier's), else drawn as transformers draws a head its checkpoint lacks
    (``_init_weights``: normal with the config's ``initializer_range``, bias 0) from torch's
    generator, which the caller seeds alike on every rank."""
    head = getattr(model, HEAD)
    head.to_empty(device="cpu")
    saved = _saved_tensors(path, [f"{HEAD}.{name}" for name, _ in head.named_parameters()])
    with torch.no_grad():
        if saved:
            for name, param in head.named_parameters():
                param.copy_(saved[f"{HEAD}.{name}"])
        else:
            nn.init.normal_(head.weight, mean=0.0, std=model.config.initializer_range)
            if head.bias is not None:
                head.bias.zero_()
    return model


def _saved_tensors(path: str, names: list[str]) -> dict[str, torch.Tensor]:
    """``names`` read from ``path``'s safetensors files (only those tensors); empty unless all are there."""
    from safetensors import safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            where = json.load(f)["weight_map"]
    else:
        where = dict.fromkeys(names, "model.safetensors")
    files = {where.get(name) for name in names}
    if None in files or not all(os.path.exists(os.path.join(path, f)) for f in files):
        return {}
    out = {}
    for file in files:
        with safe_open(os.path.join(path, file), framework="pt") as f:
            out.update({name: f.get_tensor(name) for name in names if name in f.keys()})
    return out if len(out) == len(names) else {}
