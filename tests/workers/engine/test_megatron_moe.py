"""Mixture-of-experts on the Megatron engine equals the FSDP engine (CPU, fp32, gloo).

A tiny Qwen3-MoE (softmax over all experts, top-2 weights not renormalised) split over 2 expert-
parallel ranks with the distributed optimizer, and a tiny Mixtral (top-2 renormalised) split so with
megatron's plain optimizer: log-probs, entropy, loss, gradient norm and the weights after one
AdamW step equal a single-rank FSDP engine on the transformers model within 1e-5. The router's load-
balancing loss, turned on through ``override_transformer_config``, is logged as megatron-core's
switch loss computed here from the transformers router's own logits. Real megatron-core 0.16.1 and
its all-to-all token dispatcher over gloo, behind the test-only CPU shim (tests/megatron/cpu_shim.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.megatron.ranks import run_ranks
from tests.workers.engine.test_megatron_engine import (
    TOL,
    VOCAB,
    actor_loss,
    actor_outputs,
    batch,
    close,
    optim_config,
)

EXPERTS, TOP_K = 4, 2


def moe_config(family: str, **extra):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    shared = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=TOP_K,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        router_aux_loss_coef=0.01,
    )
    shared.update(extra)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(
            **shared, head_dim=8, num_experts=EXPERTS, moe_intermediate_size=16, norm_topk_prob=False
        )
    if family == "qwen2_moe":  # a gated shared expert, and layer 1 dense (QKV bias, top-k not renormalised)
        return Qwen2MoeConfig(
            **{"mlp_only_layers": [1], **shared},
            num_experts=EXPERTS,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            intermediate_size=40,
        )
    return MixtralConfig(**shared, num_local_experts=EXPERTS, intermediate_size=16)


def build_moe(family: str, state=None):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    module = AutoModelForCausalLM.from_config(moe_config(family), attn_implementation="eager").float()
    if state is not None:
        module.load_state_dict(state)
        return module
    with torch.no_grad():  # decisive routing: no near-ties between the experts' scores
        for layer in module.model.layers:
            if hasattr(layer.mlp, "gate"):  # a MoE layer (a dense one has gate_proj)
                layer.mlp.gate.weight.normal_(0.0, 0.5)
    return module


def unpadded_batch() -> list[dict[str, torch.Tensor]]:
    """:func:`batch` without padding: megatron-core's router counts pad positions too, whose hidden
    states no two implementations agree on (their queries attend to nothing)."""
    micros = batch()
    for micro in micros:
        micro["attention_mask"] = torch.ones_like(micro["input_ids"])
        micro["position_ids"] = torch.arange(micro["input_ids"].shape[1]).expand_as(micro["input_ids"])
        micro["response_mask"] = torch.ones_like(micro["response_mask"])
    return micros


def run(engine, micros=None) -> dict:
    micros = micros or batch()
    outs = engine.infer(micros, actor_outputs)
    metrics = engine.train_step(micros, actor_loss, [0.6, 0.4])
    weights = {name: t.detach().clone().float() for name, t in engine.full_state_dict()}
    return {"outs": outs, "metrics": metrics, "weights": weights}


# name -> (model family, tensor, expert, expert tensor parallel sizes, distributed optimizer); 2 ranks
LAYOUTS = {
    "ep2": ("qwen3_moe", 1, 2, None, True),
    "ep2_plain_optimizer": ("mixtral", 1, 2, 1, False),
    "ep2_shared_expert_dense_layer": ("qwen2_moe", 1, 2, None, True),
}
FAMILIES = sorted({family for family, *_ in LAYOUTS.values()})


def megatron_moe_engine(layout: str, state, overrides=None):
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.engine import MegatronEngine

    family, tp, ep, etp, distributed_optimizer = LAYOUTS[layout]
    megatron = MegatronConfig(
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        use_distributed_optimizer=distributed_optimizer,
        override_transformer_config=overrides or {},
    )
    module = build_moe(family, state)
    return MegatronEngine(module, torch.device("cpu"), megatron, "test.megatron", optim=optim_config())


def moe_rank(rank, world, states, folder):
    """Every layout in one set of processes (groups rebuilt in between; the first one's trained
    engine saved to ``folder``), then the run with the load-balancing loss on; both data-parallel
    ranks get the same micro-batches."""
    from megatron.core import parallel_state as ps

    out = {}
    for layout in LAYOUTS:
        engine = megatron_moe_engine(layout, states[LAYOUTS[layout][0]])
        out[layout] = run(engine)
        if layout == "ep2":
            engine.save(folder, ["model"])
        ps.destroy_model_parallel()
    aux = {"moe_router_load_balancing_type": "aux_loss"}
    out["aux"] = run(megatron_moe_engine("ep2", states["qwen3_moe"], aux), unpadded_batch())["metrics"]
    return out


def fsdp_reference(family: str) -> dict:
    from verl.config.engine import FSDPConfig
    from verl.workers.engine.fsdp import FSDPEngine

    module = build_moe(family)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    switch = switch_loss(module)
    engine = FSDPEngine(module, torch.device("cpu"), FSDPConfig(), optim=optim_config(), grad_clip=1.0)
    return {"state": state, "switch": switch, **run(engine)}


def switch_loss(module) -> float:
    """megatron-core's switch load-balancing loss (without its coefficient) from the transformers
    router's logits: per layer and micro-batch, E / (k T^2) x sum over experts of (summed softmax
    probability x tokens routed there), over the T positions of :func:`unpadded_batch`; averaged over
    layers and micro-batches."""
    logits = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda mod, args, out: logits.append(out[0]))
        for layer in module.model.layers
        if hasattr(layer.mlp, "gate")
    ]
    values = []
    with torch.no_grad():
        for micro in unpadded_batch():
            logits.clear()
            module(input_ids=micro["input_ids"], position_ids=micro["position_ids"])
            for layer_logits in logits:
                probs = layer_logits.float().softmax(-1)
                routed = torch.zeros_like(probs).scatter(1, probs.topk(TOP_K, dim=-1).indices, 1.0)
                tokens = probs.shape[0]
                values.append(float((probs.sum(0) * routed.sum(0)).sum()) * EXPERTS / (TOP_K * tokens**2))
    for hook in hooks:
        hook.remove()
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def references():
    return {family: fsdp_reference(family) for family in FAMILIES}


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe_checkpoint")


@pytest.fixture(scope="module")
def moe_runs(references, checkpoint_dir):
    states = {family: ref["state"] for family, ref in references.items()}
    return run_ranks(moe_rank, 2, states, str(checkpoint_dir))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_moe_on_megatron_equals_fsdp(references, moe_runs, layout):
    ref = references[LAYOUTS[layout][0]]
    masks = [micro["response_mask"] for micro in batch()]
    for rank, got in enumerate(r[layout] for r in moe_runs):
        for want, have, mask in zip(ref["outs"], got["outs"], masks, strict=True):
            for key in want:
                assert close(want[key] * mask, have[key] * mask) < TOL, (rank, key)
        for key in ("loss", "grad_norm"):
            assert abs(ref["metrics"][key] - got["metrics"][key]) < TOL, (rank, key, got["metrics"])
        assert "moe_load_balancing_loss" not in got["metrics"]  # off by default, as verl
        assert ref["weights"].keys() == got["weights"].keys()
        for name, tensor in ref["weights"].items():
            assert close(tensor, got["weights"][name]) < TOL, (rank, name)
    moved = max(close(ref["state"][n], t) for n, t in ref["weights"].items() if "experts" in n)
    assert moved > 1e-4  # the experts trained (not two untouched copies compared)


def test_the_load_balancing_loss_is_logged_when_turned_on(references, moe_runs):
    want = references["qwen3_moe"]["switch"]
    for got in moe_runs:
        assert abs(got["aux"]["moe_load_balancing_loss"] - want) < 1e-5, (got["aux"], want)


def test_the_merger_joins_the_expert_parallel_shards(moe_runs, checkpoint_dir, tmp_path):
    """``python -m verl.model_merger merge --backend megatron`` on the 2 expert-parallel ranks' files:
    transformers loads the result with the weights the live engine exported after its step."""
    from transformers import AutoModelForCausalLM

    from verl.builtin.task import build_char_tokenizer
    from verl.model_merger import merge_megatron_checkpoint
    from verl.utils.model import save_hf_files

    save_hf_files(build_moe("qwen3_moe"), build_char_tokenizer(), str(checkpoint_dir / "huggingface"))
    target = merge_megatron_checkpoint(str(checkpoint_dir), str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(target).state_dict()
    exported = moe_runs[0]["ep2"]["weights"]
    assert merged.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(merged[name], tensor), name


KEY = "actor_rollout_ref.actor.megatron"


@pytest.mark.parametrize(
    "family,tp,ep,etp,needle",
    [
        ("qwen3_moe", 2, 1, None, f"{KEY}.tensor_model_parallel_size: expected 1 for the MoE model"),
        ("mixtral", 1, 2, 2, f"{KEY}.expert_tensor_parallel_size: expected 1"),
        (
            "qwen3_moe",
            1,
            3,
            1,
            f"{KEY}.expert_model_parallel_size: expected a divisor of the model's 4 experts",
        ),
    ],
)
def test_an_expert_split_the_engine_cannot_take_names_the_key(family, tp, ep, etp, needle):
    from verl.config.base import ConfigError
    from verl.workers.engine.megatron.arch import check_parallel

    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        check_parallel(moe_config(family), tp, 1, key=KEY, ep=ep, etp=etp)


def test_expert_parallel_on_a_dense_model_is_refused():
    from transformers import Qwen2Config

    from verl.config.base import ConfigError
    from verl.workers.engine.megatron.arch import check_parallel

    dense = Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
    with pytest.raises(ConfigError, match=r"expert_model_parallel_size: expected 1 for qwen2, a dense model"):
        check_parallel(dense, 1, 1, key=KEY, ep=2)


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("step,dense", [(1, []), (2, []), (1, [0, 3]), (2, [1])])
def test_the_moe_layers_are_the_ones_transformers_builds(family, step, dense):
    """``moe_layers`` (megatron-core's ``moe_layer_freq``) against the layers of the transformers model
    that have a router, for ``decoder_sparse_step`` and ``mlp_only_layers``."""
    from transformers import AutoModelForCausalLM

    from verl.workers.engine.megatron.moe import moe_layers
    from verl.workers.engine.megatron.weights import hf_names

    config = moe_config(family, num_hidden_layers=4, decoder_sparse_step=step, mlp_only_layers=dense)
    module = AutoModelForCausalLM.from_config(config)
    assert moe_layers(config) == tuple(hasattr(layer.mlp, "gate") for layer in module.model.layers)
    assert set(hf_names(config)) == set(module.state_dict())
