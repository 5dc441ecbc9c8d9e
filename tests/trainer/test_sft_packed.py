"""The SFT trainer on packed rows (``model.use_remove_padding``): the same token losses and gradients
as the padded forward, with the LM head run only where a trained token is predicted, and the same
metrics from a whole run. Sequence parallelism over torchrun ranks is in test_sft_trainer."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from tests.trainer.test_sft_trainer import sft_config
from tests.workers.test_packing import _config
from verl.config.base import ConfigError
from verl.config.rm_trainer import load_rm_config
from verl.config.sft_trainer import load_sft_config
from verl.trainer.sft_trainer import packed_token_losses, run_sft, token_losses
from verl.workers.packing import enable_packing

LENGTHS = [9, 4, 12, 1, 7]  # real tokens per right-padded row (one of a single token)
WIDTH = 14


def _micro(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (len(LENGTHS), WIDTH), generator=g)
    positions = torch.arange(WIDTH).expand(len(LENGTHS), WIDTH)
    mask = (positions < torch.tensor(LENGTHS)[:, None]).long()
    trained = mask * (torch.rand(mask.shape, generator=g) < 0.6).long()  # assistant tokens, scattered
    return {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "position_ids": positions * mask,
        "loss_mask": trained,
    }


def test_packed_token_losses_and_gradients_equal_the_padded_ones():
    torch.manual_seed(0)
    model = enable_packing(Qwen2ForCausalLM(_config())).train()
    micro = _micro()
    head_rows = []
    model.lm_head.register_forward_hook(lambda _m, args, _o: head_rows.append(args[0].shape[1]))

    def run(losses_fn):
        model.zero_grad()
        losses, mask = losses_fn(model, micro)
        total = (losses * mask).sum()
        total.backward()
        return total.detach(), float(mask.sum()), {n: p.grad.clone() for n, p in model.named_parameters()}

    padded, padded_tokens, padded_grads = run(token_losses)
    packed, packed_tokens, packed_grads = run(packed_token_losses)
    trained = int(micro["loss_mask"][:, 1:].sum())
    assert packed_tokens == padded_tokens == trained
    assert head_rows[-1] == trained  # the LM head ran on the predicting positions only
    assert torch.allclose(packed, padded, rtol=1e-5, atol=1e-5), (packed, padded)
    for name, grad in padded_grads.items():
        assert torch.allclose(packed_grads[name], grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.usefixtures("builtin_assets")
def test_a_packed_run_logs_the_padded_runs_metrics(tmp_path, monkeypatch):
    run = ["trainer.total_training_steps=3", "trainer.test_freq=3", "data.val_max_samples=64"]
    streams = {}
    for packed in (False, True):
        workdir = tmp_path / str(packed)
        workdir.mkdir()
        monkeypatch.chdir(workdir)
        streams[packed] = run_sft(sft_config(workdir, *run, f"model.use_remove_padding={packed}"))
    assert streams[True].keys() == streams[False].keys()
    for key, value in streams[False].items():
        assert streams[True][key] == pytest.approx(value, rel=2e-5, abs=1e-6), key


def test_sequence_parallelism_needs_packed_rows_and_the_sft_trainer():
    config = load_sft_config(
        ["ulysses_sequence_parallel_size=2", "use_remove_padding=true"]
    )  # verl's spelling
    assert config.engine.ulysses_sequence_parallel_size == 2 and config.model.use_remove_padding
    with pytest.raises(ConfigError, match=r"engine.ulysses_sequence_parallel_size: expected 1 unless"):
        load_sft_config(["engine.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"engine.ulysses_sequence_parallel_size: expected a positive"):
        load_sft_config(["engine.ulysses_sequence_parallel_size=0", "model.use_remove_padding=true"])
    with pytest.raises(ConfigError, match=r"reward-model trainer runs its pairs padded"):
        load_rm_config(["engine.ulysses_sequence_parallel_size=2", "model.use_remove_padding=true"])
