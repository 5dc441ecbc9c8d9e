"""``python -m verl.model_merger merge --backend megatron``: a TP=2 x PP=2 Megatron checkpoint (actor
and critic, after one AdamW step) becomes a Hugging Face model whose state dict is, tensor for tensor,
what the live engine exports -- tied head and vocabulary padding included (vocabulary 95 on TP=2).

Real megatron-core over gloo on 4 CPU ranks (tests/megatron/ranks.py); the merge itself runs in the
test process, without megatron-core's process groups."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("megatron.core")

import tests.workers.engine.test_megatron_engine as engine_tests
from tests.megatron.ranks import run_ranks

TP, PP = 2, 2
VOCAB = engine_tests.VOCAB


def build_hf(value_head: bool, state=None):
    """The engine tests' tiny Qwen2 (tied, vocabulary 95 so that TP pads it) or its critic."""
    return engine_tests.build_hf(engine_tests.tiny_config(value_head), value_head, state)


def micro_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    return [
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": mask.cumsum(-1) - 1,
            "responses": ids[:, 4:],
            "response_mask": mask[:, 4:].float(),
        }
    ]


def actor_loss(module, micro):
    from verl.workers.forward import EntropyOptions, response_log_probs

    loss = -response_log_probs(module, micro, 1.0, EntropyOptions())["log_probs"].mean()
    return loss, {"loss": loss.detach()}


def critic_loss(module, micro):
    from verl.workers.forward import response_values

    loss = (response_values(module, micro) - 1.0).square().mean()
    return loss, {"loss": loss.detach()}


def train_and_save(rank, world, root):
    """One AdamW step of an actor and a critic on the same TP x PP layout, each saved to its folder;
    rank 0 returns what the live engines export."""
    from verl.config.engine import OptimConfig
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.engine import MegatronEngine

    exports = {}
    for role, value_head, loss in (("actor", False, actor_loss), ("critic", True, critic_loss)):
        megatron = MegatronConfig(tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP)
        engine = MegatronEngine(
            build_hf(value_head),
            torch.device("cpu"),
            megatron,
            f"test.{role}.megatron",
            optim=OptimConfig(lr=1e-3),
            value_head=value_head,
        )
        engine.train_step(micro_batches(), loss, [1.0])
        engine.save(os.path.join(root, role), ["model", "optimizer", "extra"])
        exports[role] = {name: t.detach().clone() for name, t in engine.full_state_dict()}
    return exports if rank == 0 else None


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from verl.builtin.task import build_char_tokenizer
    from verl.utils.model import save_hf_files

    root = tmp_path_factory.mktemp("megatron_ckpt")
    for role in ("actor", "critic"):
        os.makedirs(root / role)
    exports = run_ranks(train_and_save, TP * PP, str(root))[0]
    tokenizer = build_char_tokenizer()
    for role, value_head in (("actor", False), ("critic", True)):  # what rank 0 of the worker writes
        save_hf_files(build_hf(value_head), tokenizer, str(root / role / "huggingface"))
    return root, exports


def merge_cli(local_dir, target_dir) -> None:
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "megatron"]
    subprocess.run([*cmd, "--local_dir", str(local_dir), "--target_dir", str(target_dir)], check=True)


def assert_same_state(model, export: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert state.keys() == export.keys()
    for name, tensor in export.items():
        assert torch.equal(state[name], tensor), name


def test_merged_actor_is_what_the_engine_exports(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    root, exports = checkpoint
    shards = sorted(f for f in os.listdir(root / "actor") if f.startswith("megatron_rank_"))
    assert shards == [f"megatron_rank_{r}.pt" for r in range(4)]
    merge_cli(root / "actor", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(
        tmp_path / "merged", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert merged.config.tie_word_embeddings and merged.lm_head.weight is merged.model.embed_tokens.weight
    assert_same_state(merged, exports["actor"])
    initial = build_hf(False).state_dict()
    assert not torch.equal(merged.state_dict()["model.norm.weight"], initial["model.norm.weight"])  # trained
    reference = build_hf(False, exports["actor"]).eval()
    ids = micro_batches()[0]["input_ids"]
    with torch.no_grad():
        assert torch.equal(merged(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_merged_critic_is_a_token_classifier_with_the_engine_weights(checkpoint, tmp_path):
    from transformers import AutoModelForTokenClassification

    from verl.model_merger.__main__ import main

    root, exports = checkpoint
    main(
        [
            "merge",
            "--backend",
            "megatron",
            "--local_dir",
            str(root / "critic"),
            "--target_dir",
            str(tmp_path / "c"),
        ]
    )
    merged = AutoModelForTokenClassification.from_pretrained(tmp_path / "c", dtype=torch.float32)
    assert merged.config.num_labels == 1
    assert_same_state(merged, exports["critic"])


def test_bfloat16_export_casts_every_tensor(checkpoint, tmp_path):
    from verl.model_merger import merge_megatron_checkpoint

    root, exports = checkpoint
    target = merge_megatron_checkpoint(str(root / "actor"), str(tmp_path / "bf16"), dtype="bfloat16")
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(target, "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    embed = exports["actor"]["model.embed_tokens.weight"]
    assert torch.equal(tensors["model.embed_tokens.weight"], embed.to(torch.bfloat16))


def test_errors_name_the_missing_shard_and_the_other_backend(checkpoint, tmp_path):
    from verl.model_merger import merge_fsdp_checkpoint, merge_megatron_checkpoint

    root, _ = checkpoint
    partial = tmp_path / "partial"
    shutil.copytree(root / "actor", partial)
    os.remove(partial / "megatron_rank_3.pt")
    with pytest.raises(FileNotFoundError, match=r"megatron_rank_3\.pt \(tp_rank=1, pp_rank=1\)"):
        merge_megatron_checkpoint(str(partial), str(tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match="--backend megatron"):
        merge_fsdp_checkpoint(str(partial), str(tmp_path / "out"))
    fsdp_like = tmp_path / "fsdp"
    shutil.copytree(root / "actor" / "huggingface", fsdp_like / "huggingface")
    (fsdp_like / ".metadata").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="--backend fsdp"):
        merge_megatron_checkpoint(str(fsdp_like), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
