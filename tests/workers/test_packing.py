"""Packed sequences (``use_remove_padding``): the same log-probs, entropies, values and gradients
as the padded path, on real transformers models and through the real policy and critic workers."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from verl.algorithms.advantages import compute_advantage_for
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.workers.forward import EntropyOptions, response_log_probs, response_values
from verl.workers.packing import enable_packing, pack

PROMPT, RESPONSE = 7, 6
# (left pads of the prompt, right pads of the response) per row: none, both, a one-token prompt
PADDING = [(0, 0), (3, 2), (6, 5), (1, 0), (2, RESPONSE - 1)]


def _config(**extra) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
        **extra,
    )


def _micro(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (len(PADDING), PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    for row, (left, right) in enumerate(PADDING):
        mask[row, :left] = 0
        mask[row, PROMPT + RESPONSE - right :] = 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT:],
    }


def _real(micro) -> torch.Tensor:
    return micro["attention_mask"][:, PROMPT:].bool()


def test_pack_lays_sequences_back_to_back():
    micro = _micro()
    packed = pack(micro)
    lengths = [PROMPT + RESPONSE - left - right for left, right in PADDING]
    assert packed.input_ids.shape == (1, sum(lengths))
    assert packed.cu_seqlens.tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    assert packed.max_seqlen == max(lengths)
    starts = packed.cu_seqlens[:-1].tolist()
    assert [packed.position_ids[0, s].item() for s in starts] == [0] * len(PADDING)
    # the token after each response index is that response token
    real = _real(micro)
    index = packed.response_index(RESPONSE)
    after = packed.input_ids[0, (index + 1).clamp(max=packed.input_ids.shape[1] - 1)]
    assert torch.equal(after[real], micro["responses"][real])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_log_probs_entropies_and_gradients_equal_padded(temperature):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config()).train()
    micro, real = _micro(), _real(_micro())

    def run(packed: bool):
        model.zero_grad()
        out = response_log_probs(model, micro, temperature, EntropyOptions(), packed=packed)
        ((out["log_probs"] + 0.1 * out["entropys"]) * real).sum().backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}

    padded, padded_grads = run(False)
    enable_packing(model)
    packed, packed_grads = run(True)
    for key in ("log_probs", "entropys"):
        assert torch.allclose(packed[key][real], padded[key][real], atol=1e-5), key
    for name, grad in padded_grads.items():
        assert torch.allclose(packed_grads[name], grad, atol=1e-5), name
    # a packed module still runs padded batches exactly as before
    again = response_log_probs(model, micro, temperature, EntropyOptions())
    assert torch.equal(again["log_probs"], padded["log_probs"])


def test_cpu_packed_attention_runs_each_sequence_alone(monkeypatch):
    """No call attends over the whole packed row (its mask would grow with the row's length squared):
    every SDPA call covers one sequence, and together they cover each sequence once per layer."""
    torch.manual_seed(0)
    model = enable_packing(Qwen2ForCausalLM(_config()))
    micro = _micro()
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def recording(query, *args, **kwargs):
        seen.append((query.shape[-2], kwargs.get("attn_mask") is None))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        response_log_probs(model, micro, 1.0, packed=True)
    lengths = micro["attention_mask"].sum(-1).tolist()
    assert seen == [(length, True) for length in lengths] * model.config.num_hidden_layers


def test_packed_values_equal_padded():
    torch.manual_seed(0)
    model = Qwen2ForTokenClassification(_config(num_labels=1)).eval()
    micro = _micro(1)
    padded = response_values(model, micro)
    enable_packing(model)
    packed = response_values(model, micro, packed=True)
    assert packed.shape == padded.shape
    assert torch.allclose(packed[_real(micro)], padded[_real(micro)], atol=1e-5)


def test_packed_lora_model_equals_padded():
    """peft's wrapper passes the packing arguments through to the base model."""
    from types import SimpleNamespace

    from verl.workers.engine.lora import apply_lora

    torch.manual_seed(0)
    lora = SimpleNamespace(
        lora_rank=4, lora_alpha=8, target_modules="all-linear", exclude_modules=None, lora_adapter_path=None
    )
    model = apply_lora(enable_packing(Qwen2ForCausalLM(_config())), lora)
    micro, real = _micro(2), _real(_micro(2))
    padded = response_log_probs(model, micro, 1.0)["log_probs"]
    packed = response_log_probs(model, micro, 1.0, packed=True)["log_probs"]
    assert torch.allclose(packed[real], padded[real], atol=1e-5)


def test_a_packed_module_generates_as_before():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config()).eval()
    prompt = _micro()["input_ids"][:2, :PROMPT]
    kwargs = {"attention_mask": torch.ones_like(prompt), "max_new_tokens": 5, "do_sample": False}
    before = model.generate(prompt, **kwargs)
    enable_packing(model)
    assert torch.equal(model.generate(prompt, **kwargs), before)


def test_bad_inputs_are_named():
    micro = _micro()
    micro["attention_mask"][1] = 0
    with pytest.raises(ValueError, match="use_remove_padding: a row has no tokens"):
        pack(micro)
    micro = _micro()
    micro["position_ids"] = micro["position_ids"][None].expand(3, -1, -1)
    with pytest.raises(ValueError, match=r"use_remove_padding: position_ids of shape \(3, 5, 13\)"):
        pack(micro)
    with pytest.raises(ValueError, match="Linear cannot run packed sequences"):
        enable_packing(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------- through the workers
def _start(monkeypatch, overrides: list[str], role: str):
    from verl.trainer.ppo.builders import critic_worker
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("VERL_DEVICE", "cpu")
    config = load_config(overrides)
    worker = (
        critic_worker(config).instantiate()
        if role == "critic"
        else ActorRolloutRefWorker(config.actor_rollout_ref, role=role)
    )
    worker.init_model()
    return worker, config


def _batch(tokenizer, seed: int) -> DataProto:
    """Prompts of different lengths with responses of different lengths (an EOS-free tail is padded)."""
    g = torch.Generator().manual_seed(seed)
    rows, prompt, response = 8, 6, 5
    ids = torch.randint(5, 14, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : row % 4] = 0
        mask[row, prompt + response - row % 3 :] = 0
    ids[mask == 0] = tokenizer.pad_token_id
    response_mask = mask[:, prompt:].clone()
    response_mask[::2, 1] = 0  # an interior zero, as a tool turn leaves
    data = DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "response_mask": response_mask,
            "token_level_rewards": torch.rand(rows, response, generator=g) * response_mask,
        },
        non_tensors={"uid": np.array([str(i // 2) for i in range(rows)], dtype=object)},
    )
    data.meta_info["temperature"] = 1.0
    return data


ACTOR = [
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.ppo_epochs=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
    "actor_rollout_ref.actor.optim.total_training_steps=4",
]
PACKED_ACTOR = [
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40",
]


def _actor_step(monkeypatch, builtin_assets, overrides):
    worker, config = _start(
        monkeypatch,
        [f"actor_rollout_ref.model.path={builtin_assets['model']}", *ACTOR, *overrides],
        "actor_rollout_ref",
    )
    try:
        batch, metrics = one_update(worker, config)
        after = worker.compute_log_prob(batch).batch["old_log_probs"]
        return batch, metrics, after
    finally:
        torch.distributed.destroy_process_group()


def one_update(worker, config) -> tuple[DataProto, dict[str, float]]:
    """Old and reference log-probs of a fixed batch, advantages, one actor update: the batch, its metrics."""
    batch = _batch(worker.tokenizer, 0)
    batch.union(worker.compute_log_prob(batch))
    batch.union(worker.compute_ref_log_prob(batch))
    algo = config.algorithm
    compute_advantage_for(batch, algo)
    return batch, worker.update_actor(batch).meta_info["metrics"]


def test_actor_step_packed_with_token_budgets_equals_padded(monkeypatch, builtin_assets):
    padded, padded_metrics, padded_after = _actor_step(monkeypatch, builtin_assets, [])
    packed, packed_metrics, packed_after = _actor_step(monkeypatch, builtin_assets, PACKED_ACTOR)
    real = padded.batch["attention_mask"][:, -padded.batch["responses"].shape[1] :].bool()
    for key in ("old_log_probs", "entropys", "ref_log_prob"):
        assert torch.allclose(packed.batch[key][real], padded.batch[key][real], atol=1e-5), key
    # token budgets regroup the micro-batches, so sums are reassociated: equal up to fp32 rounding
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert np.allclose(packed_metrics[key], padded_metrics[key], atol=1e-5, rtol=1e-4), key
    # As in the critic test below, Adam divides each gradient element by its own RMS, so elements near
    # zero step differently when the paths' gradients differ by fp32 rounding: over these four steps
    # the forward's gap grows ~16x (3e-6 -> 5e-5 on an Intel Xeon, at every token budget tried), so
    # the bound is the 1e-5 forward bound above times 16, rounded up. Real differences are far larger:
    # a 10% larger entropy_coeff moves these log-probs by 4e-2, seq-mean-token-mean instead of
    # token-mean by 3.8.
    assert torch.allclose(packed_after[real], padded_after[real], atol=2e-4)
    # it trained: the step moves the log-probs by 0.07 to 3.6, far more than the tolerance above
    assert not torch.allclose(padded_after[real], padded.batch["old_log_probs"][real], atol=1e-2)


def test_critic_values_and_update_packed_equal_padded(monkeypatch, builtin_assets):
    def step(extra):
        worker, _ = _start(
            monkeypatch,
            [
                f"actor_rollout_ref.model.path={builtin_assets['model']}",
                "algorithm.adv_estimator=gae",
                "actor_rollout_ref.rollout.n=2",
                "critic.ppo_mini_batch_size=2",
                "critic.ppo_micro_batch_size_per_gpu=2",
                "critic.forward_micro_batch_size_per_gpu=4",
                "critic.optim.total_training_steps=4",
                *extra,
            ],
            "critic",
        )
        try:
            batch = _batch(_tokenizer(builtin_assets), 1)
            values = worker.compute_values(batch).batch["values"]
            batch.batch["values"] = values
            batch.batch["returns"] = batch.batch["token_level_rewards"]
            metrics = worker.update_critic(batch).meta_info["metrics"]
            return values, metrics, worker.compute_values(batch).batch["values"]
        finally:
            torch.distributed.destroy_process_group()

    padded = step([])
    packed = step(["critic.model.use_remove_padding=True"])
    assert torch.allclose(packed[0], padded[0], atol=1e-5)
    assert np.allclose(packed[1]["critic/vf_loss"], padded[1]["critic/vf_loss"], atol=1e-6)
    # Adam divides each gradient element by its own RMS: elements near zero, equal in both paths up to
    # fp32 rounding, can step differently, so the values after the step agree within 1e-4 (measured
    # 3e-5), against a move of up to about 1 made by the step itself
    assert torch.allclose(packed[2], padded[2], atol=1e-4)
    assert not torch.allclose(padded[2], padded[0], atol=1e-2)


def _tokenizer(builtin_assets):
    from verl.utils.model import load_tokenizer

    return load_tokenizer(builtin_assets["model"])


def test_actor_use_remove_padding_is_verls_alias_of_the_models():
    from verl.config.verl_extras import check_verl_extras

    config = load_config(["actor_rollout_ref.actor.use_remove_padding=True"])
    check_verl_extras(config)
    assert config.actor_rollout_ref.model.use_remove_padding


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_bf16_on_cuda_runs_varlen_flash_attention_as_accurate_as_padded(monkeypatch):
    from verl.workers import packing

    assert packing._varlen_attn() is not None, "this torch has no torch.nn.attention.varlen"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config()).cuda()
    micro = {k: v.cuda() for k, v in _micro().items()}
    real = _real(micro)
    exact = response_log_probs(model, micro, 1.0)["log_probs"]  # fp32 padded
    with torch.autocast("cuda", dtype=torch.bfloat16):
        padded = response_log_probs(model, micro, 1.0)["log_probs"]
        enable_packing(model)

        def no_fallback(*args):
            raise AssertionError("packed bf16 attention on CUDA fell back to per-sequence SDPA")

        monkeypatch.setattr(packing, "_per_sequence_sdpa", no_fallback)
        packed = response_log_probs(model, micro, 1.0, packed=True)["log_probs"]
    padded_err = (padded - exact)[real].abs().max().item()
    packed_err = (packed - exact)[real].abs().max().item()
    assert packed_err <= 2 * padded_err + 1e-3, (packed_err, padded_err)
