"""The HF <-> megatron-core converter against transformers itself, on CPU ranks over gloo.

One spawn of 4 ranks runs every layout (tp x pp = 1x1, 2x1, 1x2, 2x2, re-initialising megatron-core's
groups in between) over tiny random models of each family: logits (or values) equal transformers'
at the real positions of a left-padded batch, and the export gives back the HF state dict exactly on
every rank. Left padding needs nothing special: megatron-core rotates by the index in the row, HF by
the count of real tokens, and rotary attention depends only on position differences.
"""

from __future__ import annotations

import pytest
import torch

from tests.megatron.ranks import run_ranks

TOL = 1e-5
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
CASES = {
    # name: (config class, its kwargs, value head)
    "qwen2-tied-odd-vocab": ("Qwen2Config", dict(tie_word_embeddings=True, vocab_size=67), False),
    "qwen2-untied": ("Qwen2Config", dict(tie_word_embeddings=False), False),
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False), False),
    "qwen3-head-dim-16": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=16), False),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False), False),
    "qwen2-value": ("Qwen2Config", dict(tie_word_embeddings=True, num_labels=1), True),
}


def _hf_config(case: str):
    import transformers

    cls, kwargs, _ = CASES[case]
    sizes = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=1000.0,
    )
    return getattr(transformers, cls)(**{**sizes, **kwargs})


def _hf_model(case: str):
    """The case's model with every weight random (norms too, so a misplaced norm shows)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    torch.manual_seed(0)
    config = _hf_config(case)
    auto = AutoModelForTokenClassification if CASES[case][2] else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def _batch(vocab: int):
    """Two rows of 8 tokens, the second left-padded by 3."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 8), generator=gen)
    real = torch.ones(2, 8, dtype=torch.bool)
    real[1, :3] = False
    return ids, real


def _megatron_mask(real: torch.Tensor) -> torch.Tensor:
    """``[b, 1, s, s]``, True = masked: the future and the padding keys."""
    s = real.shape[1]
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    return (future[None] | ~real[:, None, :]).unsqueeze(1)


def _run_stages(model, ids, real, hidden: int):
    """The pipeline by hand: each stage sends its hidden states ``[s, b, h]`` to the next."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    mask = _megatron_mask(real)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    if not ps.is_pipeline_first_stage():
        received = torch.empty(ids.shape[1], ids.shape[0], hidden)
        dist.recv(received, src=ps.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(received)
    out = model(ids, positions, mask)
    if not ps.is_pipeline_last_stage():
        dist.send(out.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())
        return None
    return out


def _gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1:
        return logits
    pieces = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(pieces, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(pieces, dim=-1)


def _check_case(case: str, tp: int, pp: int) -> dict:
    """Build, load, compare the forward with HF's, export; what this rank saw."""
    from verl.workers.engine.megatron import arch, weights

    hf = _hf_model(case)
    value_head = CASES[case][2]
    config = arch.transformer_config(hf.config, tp=tp, pp=pp, dtype=torch.float32)
    from megatron.core import parallel_state as ps

    model = arch.build_model(
        hf.config,
        config,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        value_head=value_head,
    ).eval()
    state = hf.state_dict()
    weights.load_hf_state(model, hf.config, state)
    ids, real = _batch(hf.config.vocab_size)
    with torch.no_grad():
        out = _run_stages(model, ids, real, hf.config.hidden_size)
        want = hf(
            input_ids=ids, attention_mask=real.long(), position_ids=(real.cumsum(-1) - 1).clamp(min=0)
        ).logits
    result = {"diff": None, "padded_logit": None}
    if out is not None:
        got = out if value_head else _gather_vocab(out)
        vocab = hf.config.vocab_size
        result["diff"] = (got[..., :vocab] - want)[real].abs().max().item()
        if got.shape[-1] > vocab:
            result["padded_logit"] = got[..., vocab:].unique().tolist()
    exported = list(weights.export_hf_state(model, hf.config))
    expected = {
        k: v for k, v in state.items() if not (k == "lm_head.weight" and hf.config.tie_word_embeddings)
    }
    result["order"] = [k for k, _ in exported] == weights.hf_names(hf.config, value_head)
    result["export_equal"] = dict(exported).keys() == expected.keys() and all(
        torch.equal(t, expected[k]) for k, t in exported
    )
    return result


def _load_errors() -> list[str]:
    """``load_hf_state``'s messages for a state dict missing a tensor and one with an extra tensor."""
    from verl.workers.engine.megatron import arch, weights

    hf = _hf_model("qwen2-untied")
    config = arch.transformer_config(hf.config, tp=1, pp=1, dtype=torch.float32)
    model = arch.build_model(hf.config, config, pre_process=True, post_process=True)
    state = hf.state_dict()
    messages = []
    for bad in (
        {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"},
        {**state, "model.layers.9.mlp.up_proj.weight": state["model.layers.1.mlp.up_proj.weight"]},
    ):
        try:
            weights.load_hf_state(model, hf.config, bad)
        except KeyError as e:
            messages.append(str(e))
    return messages


def _every_layout(rank: int, world: int) -> dict:
    """Every case under every layout in one spawn (4 ranks: the smaller layouts run data-parallel)."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    results = {}
    for tp, pp in LAYOUTS:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        for case in CASES:
            results[(case, tp, pp)] = _check_case(case, tp, pp)
        if (tp, pp) == (1, 1):
            results["load_errors"] = _load_errors()
        ps.destroy_model_parallel()
    return results


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_ranks(_every_layout, 4)


@pytest.mark.parametrize("tp,pp", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES))
def test_megatron_forward_equals_hf_at_real_positions(ranks, case, tp, pp):
    diffs = [r[(case, tp, pp)]["diff"] for r in ranks]
    last_stage = [d for d in diffs if d is not None]
    assert len(last_stage) == 4 // pp, diffs
    assert max(last_stage) < TOL, diffs


@pytest.mark.parametrize("tp,pp", LAYOUTS)
@pytest.mark.parametrize("case", list(CASES))
def test_export_gives_the_hf_state_dict_back_on_every_rank(ranks, case, tp, pp):
    for rank, result in enumerate(ranks):
        assert result[(case, tp, pp)]["export_equal"], rank
        assert result[(case, tp, pp)]["order"], rank


def test_padded_vocabulary_rows_get_a_logit_with_no_probability(ranks):
    from verl.workers.engine.megatron.arch import PADDED_LOGIT

    padded = [r[("qwen2-tied-odd-vocab", 2, pp)]["padded_logit"] for r in ranks for pp in (1, 2)]
    assert [PADDED_LOGIT] in padded
    assert all(p in (None, [PADDED_LOGIT]) for p in padded)


def test_load_names_the_missing_and_the_unexpected_tensors(ranks):
    missing, extra = ranks[0]["load_errors"]
    assert "missing ['model.layers.1.mlp.up_proj.weight']" in missing
    assert "unexpected ['model.layers.9.mlp.up_proj.weight']" in extra


# ---------------------------------------------------------------------------- errors (no ranks)
KEY = "actor_rollout_ref.actor.megatron"


@pytest.mark.parametrize(
    "tp,pp,needle",
    [
        (3, 1, f"{KEY}.tensor_model_parallel_size: expected a divisor of the model's 4 attention heads"),
        (4, 1, f"{KEY}.tensor_model_parallel_size: expected a divisor of the model's 2 key/value heads"),
        (1, 3, f"{KEY}.pipeline_model_parallel_size: expected a divisor of the model's 4 layers"),
        (1, 8, f"{KEY}.pipeline_model_parallel_size: expected a divisor of the model's 4 layers"),
    ],
)
def test_a_split_the_model_cannot_take_names_the_key(tp, pp, needle):
    from verl.config.base import ConfigError
    from verl.workers.engine.megatron.arch import check_parallel

    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        check_parallel(_hf_config("qwen2-untied"), tp, pp, key=KEY)


def test_an_unknown_architecture_is_named_with_the_known_ones():
    from transformers import GPT2Config

    from verl.utils.errors import UserInputError
    from verl.workers.engine.megatron.arch import check_parallel

    config = GPT2Config(architectures=["GPT2LMHeadModel"])
    with pytest.raises(UserInputError, match=r"cannot convert GPT2LMHeadModel .*Qwen2ForCausalLM, "):
        check_parallel(config, 1, 1, key=KEY)
    qwen = _hf_config("qwen2-untied")
    qwen.architectures = ["Qwen2ForSequenceClassification"]
    with pytest.raises(UserInputError, match="Qwen2ForSequenceClassification"):
        check_parallel(qwen, 1, 1, key=KEY)


def test_an_unknown_override_is_named():
    from verl.config.base import ConfigError
    from verl.workers.engine.megatron.arch import transformer_config

    with pytest.raises(ConfigError, match=r"override_transformer_config\.no_such_field"):
        transformer_config(
            _hf_config("llama"), tp=1, pp=1, dtype=torch.float32, overrides={"no_such_field": 1}
        )


def test_overrides_apply_last_and_null_keeps_the_default():
    from verl.workers.engine.megatron.arch import transformer_config

    config = transformer_config(
        _hf_config("qwen3-head-dim-16"),
        tp=1,
        pp=1,
        dtype=torch.float32,
        overrides={"hidden_dropout": 0.5, "recompute_method": None, "attention_backend": "flash"},
    )
    assert (config.hidden_dropout, config.recompute_method) == (0.5, None)
    assert (config.kv_channels, config.qk_layernorm, config.add_qkv_bias) == (16, True, False)


def test_sequence_parallel_is_turned_off_for_the_local_layer_spec():
    from verl.workers.engine.megatron.arch import transformer_config

    config = transformer_config(_hf_config("llama"), tp=2, pp=1, dtype=torch.float32, sequence_parallel=True)
    assert config.sequence_parallel is False
