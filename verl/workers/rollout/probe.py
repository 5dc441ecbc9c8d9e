"""Weight fingerprints: what the weight-sync check reads back from the rollout engine.

A weight sync can fail silently and partially: the load drops one layer's tensors, or a bf16 vLLM
engine on CPU keeps a stale *packed* copy of a tied LM head after the embeddings changed. At
verl's learning rates (1e-6) one missed update moves the log-probs of a probe by far less than
bf16 rounding does, so no tolerance on a log-prob gap can tell a stale engine from a healthy one.
Weights can be compared exactly instead: both sides hash the weights *in the engine's dtype*.

* the trainer hashes each tensor as it streams into the engine (:func:`fingerprinted`), cast to
  the engine's dtype the way the engine's loader casts it (round to nearest even);
* the engine hashes what it computes with: the hf rollout its own parameters, vLLM each linear
  layer's *effective* weight, read through the layer's own kernel by multiplying one-hot rows
  (``x @ W.T`` with ``x = e_k`` is column ``k`` of ``W``, exact in any dtype), since its CPU build
  pre-packs the weights of linear layers (and of the LM head) into kernel layouts and frees them.

A fingerprint is one number per *group*: a decoder layer (``model.layers.3``) or another
top-level module (``model.embed_tokens``, ``model.norm``, ``lm_head``). The hash of a group is a
sum over its elements of a pseudo-random function of (bits, input column), so it does not depend
on how an engine packs q/k/v or gate/up (they share input columns) or on element order. For each
column that function is one-to-one on the bits, so any single changed element changes the sum. Only
``columns`` sampled input columns of each matrix take part (all of them for small models), so
that reading back costs ``columns`` times the parameter count in multiply-adds; the columns
change with every version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

_MASK = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x6C8E9CF5  # odd (invertible modulo 2**32) and below 2**31: x * m fits in int64
_BITS = {2: torch.int16, 4: torch.int32}  # the engines' dtypes: (b)float16 and float32
READ_BACK_MACS = 2**28
"""Multiply-adds the engine may spend reading back one sync's sampled columns (about 0.5 GFLOP)."""
MIN_COLUMNS = 16
_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


@dataclass(frozen=True)
class FingerprintSpec:
    """What both sides hash: weights cast to ``dtype`` (a torch dtype name), ``columns`` input
    columns of each matrix chosen by ``seed``."""

    dtype: str
    columns: int
    seed: int

    @classmethod
    def for_model(cls, dtype: str, parameter_count: int, seed: int) -> FingerprintSpec:
        columns = max(MIN_COLUMNS, READ_BACK_MACS // max(parameter_count, 1))
        return cls(dtype, columns, seed)

    def column_ids(self, width: int) -> torch.Tensor:
        """The sampled input columns of a matrix ``width`` columns wide (the same on both sides)."""
        if self.columns >= width:
            return torch.arange(width)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + width)
        return torch.randperm(width, generator=generator)[: self.columns].sort().values


def group_of(name: str) -> str:
    """The group a parameter belongs to: its decoder layer, else its module."""
    layer = _LAYER.match(name)
    return layer.group(1) if layer else name.rsplit(".", 1)[0]


def hash_elements(values: torch.Tensor, columns: torch.Tensor | None, dtype: torch.dtype) -> int:
    """Order-free hash of ``values`` in ``dtype``: the sum over elements of a mix of their bits, each
    XOR-ed first with a key of its input column (``columns``, one per last-dim entry)."""
    with _one_thread(values.device):
        values = values.detach().to(dtype) + 0  # -0.0 -> +0.0: a kernel's sum may drop the sign of zero
        x = values.view(_BITS[dtype.itemsize]).to(torch.int64).bitwise_and_((1 << 8 * dtype.itemsize) - 1)
        if columns is not None:
            x ^= _mix(columns.to(x.device, torch.int64) + 1)
        return int(_mix(x).sum())  # < 2**32 per element: the sum is exact


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A one-to-one scramble of 32-bit values held in int64, in place (multiply-xorshift rounds)."""
    for m, shift in ((_M1, 16), (_M2, 15)):
        x.mul_(m).bitwise_and_(_MASK)
        x ^= x >> shift
    return x


class _one_thread:
    """On CPU, hash in one thread: the hash is a few cheap memory-bound passes, and on a loaded
    machine waking torch's thread pool for each can cost a scheduler slice (tenfold slower)."""

    def __init__(self, device: torch.device) -> None:
        self.threads = torch.get_num_threads() if device.type == "cpu" else None

    def __enter__(self) -> None:
        if self.threads is not None:
            torch.set_num_threads(1)

    def __exit__(self, *exc) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)


def hash_matrix(weight: torch.Tensor, spec: FingerprintSpec) -> int:
    """Hash of a tensor's sampled input columns (its last dimension); 1-D tensors whole."""
    dtype = getattr(torch, spec.dtype)
    if weight.dim() < 2:
        return hash_elements(weight.reshape(-1), None, dtype)
    columns = spec.column_ids(weight.shape[-1])
    picked = weight.reshape(-1, weight.shape[-1])
    if len(columns) < picked.shape[-1]:  # a sample of the columns (else all, in order)
        with _one_thread(weight.device):
            picked = picked[:, columns.to(weight.device)]
    return hash_elements(picked, columns, dtype)


class Fingerprint(dict):
    """group -> hash (a Python int, summed over the group's tensors)."""

    def add(self, name: str, value: int) -> None:
        group = group_of(name)
        self[group] = self.get(group, 0) + value


def fingerprinted(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    spec: FingerprintSpec,
    into: Fingerprint,
    skip: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass ``named_tensors`` through, hashing each (but those named in ``skip``) into ``into``."""
    for name, tensor in named_tensors:
        if name not in skip:
            into.add(name, hash_matrix(tensor, spec))
        yield name, tensor


def module_fingerprint(module: torch.nn.Module, spec: FingerprintSpec) -> Fingerprint:
    """A plain torch module's fingerprint (the hf rollout: its parameters are what it computes with;
    tied ones are counted under each name, as the trainer sends them)."""
    out = Fingerprint()
    with torch.no_grad():
        for name, param in module.named_parameters(remove_duplicate=False):
            out.add(name, hash_matrix(param, spec))
    return out


def vllm_fingerprint(worker, spec: FingerprintSpec) -> dict[str, int | None]:
    """Run inside a vLLM worker (``llm.collective_rpc``): the fingerprint of the weights the model
    computes with. Linear layers and the LM head are read through their own kernels; a group holding
    a quantized layer (which stores other numbers than the trainer sends) maps to None."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    model = worker.model_runner.model
    out: dict[str, int | None] = {}

    def add(name: str, value: int | None) -> None:
        group = group_of(name)
        if group in out and (out[group] is None or value is None):
            out[group] = None
        else:
            out[group] = out.get(group, 0) + value

    with torch.no_grad():
        for prefix, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            own = dict(module.named_parameters(recurse=False))
            if isinstance(module, ParallelLMHead) or isinstance(method, UnquantizedLinearMethod):
                rows = getattr(module, "org_vocab_size", None)  # an LM head's rows past it are padding
                add(f"{prefix}.weight", _hash_through_kernel(module, spec, rows))
                own.pop("weight")
            elif isinstance(module, VocabParallelEmbedding):  # looked up, not multiplied: as stored
                add(f"{prefix}.weight", hash_matrix(module.weight[: module.org_vocab_size], spec))
                own.pop("weight")
            elif isinstance(method, UnquantizedFusedMoEMethod):  # transformers' fused expert tensors
                for name in ("w13_weight", "w2_weight"):
                    add(f"{prefix}.{name}", hash_matrix(_expert_weight(module, method, own.pop(name)), spec))
            elif method is not None:
                add(f"{prefix}.weight", None)
            for name, param in own.items():
                add(f"{prefix}.{name}", hash_matrix(param, spec))
    return out


def _hash_through_kernel(module: torch.nn.Module, spec: FingerprintSpec, rows: int | None) -> int:
    """:func:`hash_matrix` of a vLLM linear layer's weight ``W`` [out, in] as its kernel computes
    with it (the packed copy): one-hot rows ``e_k`` give ``e_k @ W.T = W[:, k]``, exact in any dtype."""
    width = (  # column-/row-parallel layers, a replicated one (a MoE router), an LM head
        getattr(module, "input_size_per_partition", None)
        or getattr(module, "input_size", None)
        or module.embedding_dim
    )
    dtype = getattr(module, "params_dtype", None) or module.weight.dtype
    device = next(p.device for p in module.parameters())
    columns = spec.column_ids(width).to(device)
    one_hot = torch.zeros(len(columns), width, dtype=dtype, device=device)
    one_hot[torch.arange(len(columns), device=device), columns] = 1
    with _exact_matmul():
        read = module.quant_method.apply(module, one_hot).t()[:rows]  # [out, columns]
    return hash_elements(read, columns, getattr(torch, spec.dtype))


_UNPACKING: dict[tuple, torch.Tensor] = {}
"""(kernel class, its ISA, one expert's shape, dtype) -> where each prepacked element came from."""


def _expert_weight(module: torch.nn.Module, method, stored: torch.Tensor) -> torch.Tensor:
    """A vLLM MoE layer's ``w13_weight`` / ``w2_weight`` in transformers' layout (``[E, 2F, H]`` gate
    then up, ``[E, H, F]``). vLLM's CPU kernel keeps them prepacked: a permutation of each expert's
    elements, found once per shape by prepacking the base-256 digits of every element's index (small
    integers, exact in any float dtype) and undone here; other kernels store them as loaded."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    kernel = getattr(method.moe_kernel, "fused_experts", None)
    if not isinstance(kernel, CPUUnquantizedExperts) or kernel._use_zentorch:
        return stored
    experts, one = stored.shape[0], tuple(stored.shape[1:])
    key = (type(kernel).__name__, kernel.isa, one, stored.dtype)
    if key not in _UNPACKING:
        from vllm import _custom_ops as ops

        count = stored[0].numel()
        index, origin = torch.arange(count), torch.zeros(count, dtype=torch.int64)
        for digit in range(4):  # 4 x 8 bits: any expert matrix
            values = ((index >> (8 * digit)) & 255).to(stored.dtype).reshape(1, *one)
            origin |= ops.cpu_prepack_moe_weight(values, kernel.isa).reshape(-1).long() << (8 * digit)
        _UNPACKING[key] = origin.argsort()
    return stored.reshape(experts, -1)[:, _UNPACKING[key]].reshape(stored.shape)


class _exact_matmul:
    """fp32 products of one-hot rows are exact unless CUDA rounds the inputs to TF32."""

    def __enter__(self) -> None:
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.saved


def stale_groups(sent: Fingerprint, engine: dict[str, int | None]) -> tuple[list[str], int]:
    """Groups whose engine fingerprint differs from the sent one, and how many groups were compared
    (groups the engine cannot read, or does not name as the trainer does, are not)."""
    compared = [g for g in sent if engine.get(g) is not None]
    return [g for g in compared if engine[g] != sent[g]], len(compared)
