"""LoRA on the Megatron engine equals peft's LoRA on the FSDP engine (CPU, fp32, gloo, TP=2).

Same base weights, same adapters (rank 4, alpha 8, all four megatron linears): the peft model's
adapters, with B drawn nonzero and the A of q/k/v (gate/up) shared as megatron's fused linears
hold one (tied: one parameter), are loaded into the Megatron engine. Log-probs, entropy, loss, gradient norm, and after
one AdamW step the adapters and the merged weights agree within 1e-5; the base weights do not move;
the reference (adapters off) is the base model; a save resumes bit for bit. Tensor parallel 2 (the
distributed optimizer) and pipeline parallel 2 in turn, in one spawn of 2 ranks; LoRA on a MoE
model is refused there."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("peft")

from tests.megatron.ranks import run_ranks
from tests.workers.engine.test_megatron_engine import (
    actor_loss,
    actor_outputs,
    batch,
    build_hf,
    close,
    resume,
    tiny_config,
)

TOL = 1e-5
RANK, ALPHA = 4, 8
LORA = SimpleNamespace(
    lora_rank=RANK,
    lora_alpha=ALPHA,
    target_modules="all-linear",
    exclude_modules=None,
    lora_adapter_path=None,
)


def optim_config():
    """AdamW with ``eps=1e-3``: its first step moves each weight by ``lr * g / (|g| + eps)``, which at
    the default 1e-8 turns the fp32 rounding of gradients near zero (some of B's after cancellation)
    into update differences near the tolerance; here the step stays smooth in the gradient, so the
    comparison checks the gradients (measured: adapters within 1.3e-7 after the step, 7.6e-6 with
    eps=1e-8), while the largest moves are still ~lr."""
    from verl.config.engine import OptimConfig

    return OptimConfig(lr=1e-3, weight_decay=0.01, eps=1e-3)


def shared_adapters(module) -> None:
    """Nonzero B everywhere; q/k/v and gate/up share their layer's A as one parameter: megatron's
    fused linear has one A, whose gradient is the sum of its HF linears' (peft's separate A per
    linear would get three gradients and three AdamW updates)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in module.base_model.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for group in (
                (attn.q_proj, attn.k_proj, attn.v_proj),
                (attn.o_proj,),
                (mlp.gate_proj, mlp.up_proj),
                (mlp.down_proj,),
            ):
                a = group[0].lora_A["default"].weight
                a.copy_(torch.randn(a.shape, generator=g) * 0.3)
                for linear in group:
                    linear.lora_A["default"].weight = a  # one parameter: one gradient, one AdamW update
                    b = linear.lora_B["default"].weight
                    b.copy_(torch.randn(b.shape, generator=g) * 0.3)


def infer(engine, micros):
    return engine.infer(micros, actor_outputs)


def fsdp_reference() -> dict:
    from verl.config.engine import FSDPConfig
    from verl.workers.engine.fsdp import FSDPEngine
    from verl.workers.engine.lora import apply_lora

    module = build_hf(tiny_config(False), False)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    micros = batch()
    with torch.no_grad():
        base = [actor_outputs(module, m) for m in micros]
    module = apply_lora(module, LORA)
    shared_adapters(module)
    engine = FSDPEngine(module, torch.device("cpu"), FSDPConfig(), optim=optim_config(), grad_clip=1.0)
    adapters = {n: t.clone() for n, t in engine.adapter_tensors()}
    outs = infer(engine, micros)
    metrics = engine.train_step(micros, actor_loss, [0.6, 0.4])
    return {
        "state": state,
        "base": base,
        "adapters": adapters,
        "outs": outs,
        "metrics": metrics,
        "merged": {n: t.clone() for n, t in engine.full_state_dict()},
        "adapters_after": {n: t.clone() for n, t in engine.adapter_tensors()},
    }


LAYOUTS = {"tp2": (2, 1, True), "pp2": (1, 2, False)}
"""(tensor, pipeline, distributed optimizer): each runs in the same 2 processes in turn."""


def lora_engine(state, adapters=None, layout=LAYOUTS["tp2"], module=None):
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.engine import MegatronEngine
    from verl.workers.engine.megatron.lora import LoraSettings

    tp, pp, distributed = layout
    module = module or build_hf(tiny_config(False), False, state)
    megatron = MegatronConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, use_distributed_optimizer=distributed
    )
    settings = LoraSettings(RANK, ALPHA, ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))
    engine = MegatronEngine(
        module, torch.device("cpu"), megatron, "test.megatron", optim=optim_config(), lora=settings
    )
    if adapters is not None:
        engine.load_adapters(adapters)
    return engine


def run_layout(state, adapters, layout) -> dict:
    """The checks of one layout (see the module doc)."""
    fresh = lora_engine(state, layout=layout)
    fresh_merged = dict(fresh.full_state_dict())
    engine = lora_engine(state, adapters, layout)
    model = engine._bare_model()
    base = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora." not in n}
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    loaded = {n: t.clone() for n, t in engine.adapter_tensors()}  # A is exported as a view
    micros = batch()
    with engine.disabled_adapter():
        reference = infer(engine, micros)
    return {
        "fresh_equals_base": all(torch.equal(state[n], t) for n, t in fresh_merged.items()),
        "trainable": trainable,
        "loaded": loaded,
        "reference": reference,
        "outs": infer(engine, micros),
        "metrics": engine.train_step(micros, actor_loss, [0.6, 0.4]),
        "merged": dict(engine.full_state_dict()),
        "adapters_after": dict(engine.adapter_tensors()),
        "base_unchanged": all(torch.equal(base[n], p) for n, p in model.named_parameters() if n in base),
    }


def moe_refusal(layout) -> str:
    """The error of LoRA on a MoE model (Qwen3-MoE), raised before the model is built."""
    from tests.workers.engine.test_megatron_moe import build_moe
    from verl.config.base import ConfigError

    try:
        lora_engine(None, layout=layout, module=build_moe("qwen3_moe"))
    except ConfigError as error:
        return str(error)
    return "no error"


def megatron_rank(rank, world, state, adapters, folder):
    from megatron.core import parallel_state as ps

    out = {}
    for name, layout in LAYOUTS.items():
        out[name] = run_layout(state, adapters, layout)
        if name == "tp2":
            out["resume"] = resume(folder, functools.partial(lora_engine, state, adapters, layout))
        else:
            out["moe"] = moe_refusal(layout)
        ps.destroy_model_parallel()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ref = fsdp_reference()
    folder = str(tmp_path_factory.mktemp("lora_resume"))
    return ref, run_ranks(megatron_rank, 2, ref["state"], ref["adapters"], folder)


def assert_outs_close(want, have):
    masks = [micro["response_mask"] for micro in batch()]  # what pads predict is read by no one
    for w, h, mask in zip(want, have, masks):
        assert w.keys() == h.keys()
        for key in w:
            assert close(w[key] * mask, h[key] * mask) < TOL, key


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_lora_equals_peft_lora_on_fsdp(runs, layout):
    ref, ranks = runs
    for got in (r[layout] for r in ranks):
        assert_outs_close(ref["outs"], got["outs"])
        for key in ("loss", "grad_norm"):
            assert abs(ref["metrics"][key] - got["metrics"][key]) < TOL, (key, ref["metrics"], got["metrics"])
        assert ref["merged"].keys() == got["merged"].keys()
        for name, tensor in ref["merged"].items():
            assert close(tensor, got["merged"][name]) < TOL, name
        assert ref["adapters_after"].keys() == got["adapters_after"].keys()
        for name, tensor in ref["adapters_after"].items():
            assert close(tensor, got["adapters_after"][name]) < TOL, name
    # the adapters mattered and moved: the merged weights are not the base, the step changed them
    assert max(close(ref["state"][n], t) for n, t in ref["merged"].items()) > 1e-2
    assert max(close(ref["adapters"][n], t) for n, t in ref["adapters_after"].items()) > 5e-4


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_only_the_adapters_train_and_start_at_the_base_model(runs, layout):
    ref, ranks = runs
    for got in (r[layout] for r in ranks):
        assert got["trainable"] and all(".lora.lora_" in n for n in got["trainable"])
        assert got["base_unchanged"]
        assert got["fresh_equals_base"]  # peft's init: B = 0
        for name, tensor in ref["adapters"].items():  # loaded adapters export back unchanged
            assert torch.equal(tensor, got["loaded"][name]), name


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_reference_is_the_base_model(runs, layout):
    ref, ranks = runs
    for got in (r[layout] for r in ranks):
        assert_outs_close(ref["base"], got["reference"])


def test_a_saved_lora_engine_resumes_bit_for_bit(runs):
    for got in runs[1]:
        want, have, same = got["resume"]
        assert want == have and same


def test_lora_on_a_moe_model_is_refused_naming_the_key(runs):
    for got in runs[1]:
        assert got["moe"].startswith("actor_rollout_ref.model.lora_rank: expected 0 for the MoE model"), got[
            "moe"
        ]


@pytest.mark.parametrize(
    "value, message",
    [
        (["q_proj", "k_proj"], "megatron fuses them in linear_qkv"),
        (["gate_proj"], "megatron fuses them in linear_fc1"),
        (["lm_head"], "HF names"),
    ],
)
def test_bad_megatron_lora_targets_name_the_key(value, message):
    from verl.config.base import ConfigError
    from verl.config.megatron import megatron_lora_targets

    with pytest.raises(ConfigError, match=rf"actor_rollout_ref\.model\.target_modules: .*{message}"):
        megatron_lora_targets(value, "actor_rollout_ref.model.target_modules")


def test_hf_target_names_map_onto_megatron_linears():
    from verl.config.megatron import megatron_lora_targets

    assert megatron_lora_targets("all-linear", "k") == (
        "linear_qkv",
        "linear_proj",
        "linear_fc1",
        "linear_fc2",
    )
    hf = ["q_proj", "k_proj", "v_proj", "down_proj"]
    assert megatron_lora_targets(hf, "k") == ("linear_qkv", "linear_fc2")
    assert megatron_lora_targets("o_proj,linear_fc1", "k") == ("linear_proj", "linear_fc1")
