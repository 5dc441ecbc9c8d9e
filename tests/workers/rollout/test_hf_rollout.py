"""The hf rollout: shapes, EOS handling, seeded sampling, and log-prob agreement with the trainer."""

from __future__ import annotations

import math

import torch

from verl.config.engine import FSDPConfig
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.utils.model import eos_token_ids, load_causal_lm, load_tokenizer
from verl.workers.engine.fsdp import FSDPEngine
from verl.workers.engine.micro_batch import split_micro_batches
from verl.workers.forward import POLICY_INPUT_KEYS, response_log_probs
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.sampling import SamplingParams, filter_logits

PROMPTS = ["3+4=", "9+9=", "1+0=", "5+7=", "2+2=", "8+1="]


def make_rollout(builtin_assets, **overrides) -> tuple[HFRollout, object]:
    overrides.setdefault("calculate_log_probs", True)
    config = load_config([f"actor_rollout_ref.rollout.{k}={v}" for k, v in overrides.items()])
    model_cfg = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model_cfg.path)
    rollout = HFRollout(
        load_causal_lm(model_cfg),
        config.actor_rollout_ref.rollout,
        tokenizer.pad_token_id,
        eos_token_ids(tokenizer, model_cfg.path),
        torch.device("cpu"),
        seed=0,
    )
    return rollout, tokenizer


def prompt_batch(tokenizer, prompts: list[str], width: int = 6) -> DataProto:
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


def test_generation_layout_and_eos(builtin_assets):
    rollout, tokenizer = make_rollout(builtin_assets, response_length=5)
    out = rollout.generate_sequences(prompt_batch(tokenizer, PROMPTS))
    b = out.batch
    assert b["responses"].shape == (6, 5) and b["input_ids"].shape == (6, 11)
    assert torch.equal(b["input_ids"][:, 6:], b["responses"])
    assert torch.equal(b["attention_mask"][:, 6:], b["response_mask"])
    eos = tokenizer.eos_token_id
    for row, mask in zip(b["responses"].tolist(), b["response_mask"].tolist()):
        n = sum(mask)
        if eos in row:  # the mask covers up to and including the first EOS, padding after it
            assert n == row.index(eos) + 1
            assert all(t == tokenizer.pad_token_id for t in row[n:])
        else:
            assert n == 5
    # positions continue from the last prompt position
    assert torch.equal(b["position_ids"][:, 6:], b["position_ids"][:, 5:6] + torch.arange(1, 6))
    assert (b["response_versions"][b["response_mask"].bool()] == 0).all()


def test_seeded_sampling_is_reproducible(builtin_assets):
    first, tokenizer = make_rollout(builtin_assets)
    second, _ = make_rollout(builtin_assets)
    batch = prompt_batch(tokenizer, PROMPTS * 4)
    a, b = first.generate_sequences(batch), second.generate_sequences(batch)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    state = first.state_dict()
    c = first.generate_sequences(batch)
    first.load_state_dict(state)
    assert torch.equal(first.generate_sequences(batch).batch["responses"], c.batch["responses"])


def test_a_request_with_a_sampling_seed_replays_exactly(builtin_assets):
    """What the async trainer relies on to regenerate in-flight batches after a resume."""
    rollout, tokenizer = make_rollout(builtin_assets, response_length=4)
    batch = prompt_batch(tokenizer, PROMPTS * 4)
    seeded = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
    seeded.meta_info["sampling_seed"] = 7
    first = rollout.generate_sequences(seeded).batch["responses"]
    rollout.generate_sequences(batch)  # the stream moves on in between
    assert torch.equal(rollout.generate_sequences(seeded).batch["responses"], first)
    seeded.meta_info["sampling_seed"] = 8
    assert not torch.equal(rollout.generate_sequences(seeded).batch["responses"], first)


def test_rollout_log_probs_equal_trainer_recompute(builtin_assets):
    """The behaviour log-probs equal the actor engine's recomputation bit for bit (CPU, fp32)."""
    rollout, tokenizer = make_rollout(builtin_assets, response_length=4, log_prob_micro_batch_size_per_gpu=8)
    out = rollout.generate_sequences(prompt_batch(tokenizer, PROMPTS * 3))
    config = load_config([])
    engine = FSDPEngine(load_causal_lm(config.actor_rollout_ref.model), torch.device("cpu"), FSDPConfig())
    micro, _ = split_micro_batches(out, POLICY_INPUT_KEYS, 8)
    trainer_lp = torch.cat(
        [o["log_probs"] for o in engine.infer(micro, lambda m, b: response_log_probs(m, b, 1.0))]
    )
    mask = out.batch["response_mask"].bool()
    diff = (trainer_lp - out.batch["rollout_log_probs"]).abs()[mask].max().item()
    print(f"max |rollout - trainer| log-prob diff: {diff}")
    assert diff == 0.0
    # the KV-cached decode differs only by float rounding (reported as a metric)
    gap = out.meta_info["metrics"]["rollout/decode_logprob_diff_max"]
    assert 0 <= gap < 1e-4


def test_greedy_validation_has_no_logprob_recompute(builtin_assets):
    rollout, tokenizer = make_rollout(builtin_assets)
    batch = prompt_batch(tokenizer, PROMPTS)
    batch.meta_info["validate"] = True
    a = rollout.generate_sequences(batch)
    b = rollout.generate_sequences(batch)
    assert torch.equal(a.batch["responses"], b.batch["responses"])  # greedy: no randomness
    assert "rollout_log_probs" not in a.batch.keys()


def test_top_k_top_p_filtering_by_hand():
    # probabilities 0.5, 0.25, 0.125, 0.125
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    assert torch.isinf(filter_logits(logits, top_k=2, top_p=1.0)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, top_k=-1, top_p=0.7)[0])
    assert kept.tolist() == [True, True, False, False]  # 0.5 < 0.7, so the second token is needed
    kept = ~torch.isinf(filter_logits(logits, top_k=-1, top_p=0.5)[0])
    assert kept.tolist() == [True, False, False, False]


def test_sampling_params_follow_val_kwargs():
    config = load_config(
        [
            "actor_rollout_ref.rollout.val_kwargs.temperature=0.5",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        ]
    )
    train = SamplingParams.resolve(config.actor_rollout_ref.rollout, {})
    val = SamplingParams.resolve(config.actor_rollout_ref.rollout, {"validate": True})
    assert (train.temperature, train.do_sample, train.validate) == (1.0, True, False)
    assert (val.temperature, val.do_sample, val.validate) == (0.5, True, True)
    greedy = SamplingParams.resolve(config.actor_rollout_ref.rollout, {"temperature": 0})
    assert not greedy.do_sample and math.isclose(greedy.top_p, 1.0)


def test_columns_of_padding_every_prompt_has_are_not_run(builtin_assets):
    """Prompts padded wider than the longest one generate the same tokens and log-probs, and the model
    never runs the columns no prompt uses (the layout of the output keeps the full width)."""
    rollout, tokenizer = make_rollout(builtin_assets, response_length=5)
    widths = []
    rollout.module.model.embed_tokens.register_forward_hook(
        lambda m, args, out: widths.append(args[0].shape[1])
    )
    narrow = rollout.generate_sequences(prompt_batch(tokenizer, PROMPTS, width=4))
    rollout.generator.manual_seed(rollout.seed)
    wide = rollout.generate_sequences(prompt_batch(tokenizer, PROMPTS, width=12))
    assert wide.batch["input_ids"].shape == (6, 17)
    assert torch.equal(wide.batch["responses"], narrow.batch["responses"])
    torch.testing.assert_close(
        wide.batch["rollout_log_probs"], narrow.batch["rollout_log_probs"], rtol=0, atol=1e-6
    )
    assert max(widths) == 4 + 5  # the log-prob recompute over prompt and response, 8 pad columns dropped


def test_the_prefill_runs_the_lm_head_on_the_last_position_only(builtin_assets):
    """The prefill samples from the last prompt position: the LM head skips the others and gives
    that position's logits as a forward over every position does (to the GEMM's rounding: a
    one-row product may sum in another order)."""
    rollout, tokenizer = make_rollout(builtin_assets, response_length=3)
    batch = prompt_batch(tokenizer, PROMPTS, width=8).batch
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    head_positions = []
    rollout.module.lm_head.register_forward_hook(lambda m, args, out: head_positions.append(out.shape[1]))
    logits, _ = rollout._prefill(ids, mask, pos)
    assert head_positions == [1]
    with torch.no_grad():
        full = rollout.module(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert head_positions[-1] == 8
    torch.testing.assert_close(logits, full[:, -1].float(), rtol=0, atol=1e-5)
