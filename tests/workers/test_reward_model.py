"""The reward-model worker: its scores equal a plain ``transformers`` forward on the same text
(re-templated with the reward model's own tokenizer), on one rank and sharded over two."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.builtin import task as builtin
from verl.config.reward import RewardModelConfig
from verl.protocol import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, create_colocated_worker_groups
from verl.utils.model import ModelPathError, TokenizerSource, load_reward_model
from verl.utils.reward_inputs import render_conversation
from verl.workers.reward_model import RewardModelWorker

PROMPTS = ["12+7=", "3+4=", "50+50=", "1+1=", "9+9=", "23+45="]
RESPONSES = ["19", "7", "100", "2<eos>", "", "6899"]  # one ends with EOS, one is empty


def save_tiny_reward_model(folder, seed: int = 3) -> None:
    """A tiny Qwen2 sequence classifier (one label) with the built-in character tokenizer, whose
    chat template differs from the policy's (the worker must re-template)."""
    from transformers import Qwen2ForSequenceClassification

    tokenizer = builtin.build_char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"
    config = builtin.build_tiny_qwen2(tokenizer).config
    config.num_labels = 1
    config.architectures = ["Qwen2ForSequenceClassification"]
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # scores of order 1, not of the init's 0.02
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def policy_batch(tokenizer) -> DataProto:
    """Left-padded prompts and right-padded responses as the rollout returns them."""
    prompt_ids = [tokenizer(builtin_prompt(p), add_special_tokens=False)["input_ids"] for p in PROMPTS]
    response_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in RESPONSES]
    p_len, r_len = max(map(len, prompt_ids)), max(map(len, response_ids)) + 2
    pad = tokenizer.pad_token_id
    prompts = torch.tensor([[pad] * (p_len - len(ids)) + ids for ids in prompt_ids])
    responses = torch.tensor([ids + [pad] * (r_len - len(ids)) for ids in response_ids])
    mask = torch.cat(
        [
            torch.tensor([[0] * (p_len - len(ids)) + [1] * len(ids) for ids in prompt_ids]),
            torch.tensor([[1] * len(ids) + [0] * (r_len - len(ids)) for ids in response_ids]),
        ],
        dim=1,
    )
    messages = np.empty(len(PROMPTS), dtype=object)
    messages[:] = [[{"role": "user", "content": p}] for p in PROMPTS]
    return DataProto.from_dict(
        {"prompts": prompts, "responses": responses, "attention_mask": mask}, {"raw_prompt": messages}
    )


def builtin_prompt(text: str) -> str:
    return builtin.build_char_tokenizer().apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def reference_scores(folder) -> list[float]:
    """One unpadded ``AutoModelForSequenceClassification`` forward per conversation."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    scores = []
    for prompt, response in zip(PROMPTS, RESPONSES):
        text = render_conversation(
            tokenizer, [{"role": "user", "content": prompt}], response.replace("<eos>", "")
        )
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            scores.append(model(input_ids=ids).logits[0, 0].item())
    return scores


def score_with_worker(folder, ranks: int, **overrides) -> DataProto:
    config = RewardModelConfig(enable=True)
    config.model.path = str(folder)
    for key, value in overrides.items():
        setattr(config, key, value)
    policy = builtin.build_char_tokenizer()
    pool = RayResourcePool([ranks], use_gpu=False, name_prefix=f"rm{ranks}", cpus_per_process=0.5)
    worker = RayClassWithInitArgs(
        RewardModelWorker, config, policy_tokenizer=TokenizerSource(path=str(folder))
    )
    wg = create_colocated_worker_groups(pool, {"reward_model": worker})["reward_model"]
    try:
        wg.init_model()
        return wg.compute_rm_score(policy_batch(policy))
    finally:
        wg.shutdown()
        pool.release()


# Before the two-rank case: the one-rank case below starts in the worker process this one leaves.
def test_max_length_keeps_the_end_of_long_conversations(ray_session, tmp_path):
    save_tiny_reward_model(tmp_path)
    out = score_with_worker(tmp_path, 1, max_length=8)
    # in the reward model's template "12+7==19=", "50+50==100=" and "23+45==6899=" are longer
    # than 8 tokens; "3+4==7=", "1+1==2=" and "9+9===" are not
    truncated = out.batch["rm_truncated"].tolist()
    assert truncated == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "ranks, overrides",
    [
        (1, {"micro_batch_size_per_gpu": 4}),
        (2, {"use_dynamic_bsz": True, "forward_max_token_len_per_gpu": 20}),
    ],
)
def test_worker_scores_equal_a_plain_transformers_forward(ray_session, tmp_path, ranks, overrides):
    save_tiny_reward_model(tmp_path)
    expected = reference_scores(tmp_path)
    out = score_with_worker(tmp_path, ranks, **overrides)
    rm_scores = out.batch["rm_scores"]
    policy = builtin.build_char_tokenizer()
    lengths = [len(policy(r, add_special_tokens=False)["input_ids"]) for r in RESPONSES]
    for row, n in enumerate(lengths):
        # the score sits on the response's last token (position 0 for the empty one), zeros elsewhere
        at = max(n - 1, 0)
        assert rm_scores[row, at].item() == pytest.approx(expected[row], rel=1e-4, abs=1e-5), row
        assert torch.count_nonzero(torch.cat([rm_scores[row, :at], rm_scores[row, at + 1 :]])) == 0
    assert len(set(round(s, 4) for s in expected)) == len(expected)  # the texts really score differently
    assert out.batch["rm_truncated"].sum().item() == 0


def test_a_causal_lm_is_refused_as_a_reward_model(builtin_assets):
    config = RewardModelConfig(enable=True)
    config.model.path = str(builtin.builtin_model_dir())
    with pytest.raises(ModelPathError, match=r"reward_model\.model\.path.*no trained score head"):
        load_reward_model(config.model)
