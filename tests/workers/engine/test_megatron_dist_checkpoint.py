"""``megatron.use_dist_checkpointing``: the Megatron engine starts from a megatron-core distributed
checkpoint written by ``scripts/converter_hf_to_mcore.py`` (CPU, fp32, gloo).

A tiny Qwen2 is converted at tensor parallel 2 (``--test`` reads it back); engines at TP=2, at
pipeline parallel 2 (another layout: the format is resharded on load), and with a key prefix load it
and give the Hugging Face model's log-probs and entropy within 1e-5, though the HF module handed to
them holds other weights; a critic takes its trunk from the checkpoint and its value head from its
HF module. A wrong path and a checkpoint of another model fail naming the key. Real megatron-core
0.16.1 over gloo, behind the test-only CPU shim (tests/megatron/cpu_shim.py); one spawn of 2 ranks
for every test."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.megatron.ranks import run_ranks
from tests.workers.engine.test_megatron_engine import (
    actor_outputs,
    batch,
    build_hf,
    close,
    critic_outputs,
    tiny_config,
)

TOL = 1e-5
KEY = "test.megatron"
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "converter_hf_to_mcore.py")
PREFIX = "module."  # as NeMo 2 writes it


def other_weights(config, value_head: bool, seed: int = 1):
    """A module of ``config`` whose weights are not the converted model's."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    torch.manual_seed(seed)
    cls = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    return cls.from_config(config, attn_implementation="eager").float()


def critic_with_trunk(lm):
    """A critic whose trunk is ``lm``'s (what the checkpoint holds) and whose value head is its own."""
    critic = other_weights(tiny_config(True), True, seed=2)
    critic.model.load_state_dict(lm.model.state_dict())
    return critic


def engine(module, tp: int, pp: int, path: str | None, prefix: str = "", value_head: bool = False):
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.engine import MegatronEngine

    megatron = MegatronConfig(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        use_dist_checkpointing=True,
        dist_checkpointing_path=path,
        dist_checkpointing_prefix=prefix,
    )
    return MegatronEngine(module, torch.device("cpu"), megatron, KEY, value_head=value_head)


def convert(hf_dir: str, ckpt: str) -> None:
    """The user's command, run in the ranks: ``scripts/converter_hf_to_mcore.py ... --tp_size 2 --test``."""
    spec = importlib.util.spec_from_file_location("converter_hf_to_mcore", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--hf_model_path", hf_dir, "--output_path", ckpt, "--tp_size", "2", "--test"])


def write_prefixed(model, folder: str) -> None:
    """The checkpoint again, its keys under :data:`PREFIX`."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        os.makedirs(folder)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(prefix=PREFIX), folder)


def refusal(build) -> str:
    from verl.config.base import ConfigError

    try:
        build()
    except ConfigError as error:
        return str(error)
    return "no error"


def rank_main(rank, world, root):
    """Everything the tests read, on 2 ranks: megatron-core's groups rebuilt between layouts."""
    from megatron.core import parallel_state as ps

    hf_dir, ckpt = os.path.join(root, "hf"), os.path.join(root, "mcore")
    convert(hf_dir, ckpt)
    ps.destroy_model_parallel()
    config, micros = tiny_config(False), batch()
    out = {"files": sorted(os.listdir(ckpt)), "partial_left": os.path.exists(ckpt + ".partial")}
    lm = other_weights(config, False)
    tp2 = engine(lm, 2, 1, ckpt)
    out["tp2"] = tp2.infer(micros, actor_outputs)
    write_prefixed(tp2._bare_model(), os.path.join(root, "prefixed"))
    out["prefix"] = engine(other_weights(config, False), 2, 1, os.path.join(root, "prefixed"), PREFIX).infer(
        micros, actor_outputs
    )
    critic = critic_with_trunk(build_hf(config, False))
    critic.model.load_state_dict(other_weights(config, False).model.state_dict())  # not the checkpoint's
    out["critic"] = engine(critic, 2, 1, ckpt, value_head=True).infer(micros, critic_outputs)
    out["missing"] = refusal(
        lambda: engine(other_weights(config, False), 2, 1, os.path.join(root, "nowhere"))
    )
    out["not_a_checkpoint"] = refusal(lambda: engine(other_weights(config, False), 2, 1, hf_dir))
    fewer = tiny_config(False)
    fewer.num_hidden_layers = 2
    out["fewer_layers"] = refusal(lambda: engine(other_weights(fewer, False), 2, 1, ckpt))
    untied = tiny_config(False)
    untied.tie_word_embeddings = False  # asks for an output layer the tied model's checkpoint lacks
    out["untied"] = refusal(lambda: engine(other_weights(untied, False), 2, 1, ckpt))
    ps.destroy_model_parallel()
    out["pp2"] = engine(other_weights(config, False), 1, 2, ckpt).infer(micros, actor_outputs)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The HF model's outputs (the reference) and each rank's results, computed once."""
    root = tmp_path_factory.mktemp("dist_checkpoint")
    lm = build_hf(tiny_config(False), False)
    lm.save_pretrained(os.path.join(root, "hf"))
    critic = critic_with_trunk(lm)
    with torch.no_grad():
        want = {
            "actor": [actor_outputs(lm, m) for m in batch()],
            "critic": [critic_outputs(critic, m) for m in batch()],
        }
    return want, run_ranks(rank_main, 2, str(root))


def assert_same(want: list[dict], got: list[dict]) -> None:
    for micro, w, g in zip(batch(), want, got, strict=True):
        mask = micro["response_mask"]  # what pads predict is read by no one
        assert w.keys() == g.keys()
        for key in w:
            assert close(w[key] * mask, g[key] * mask) < TOL, key


def test_the_converter_writes_a_distributed_checkpoint_atomically(runs):
    for got in runs[1]:
        assert "metadata.json" in got["files"] and "common.pt" in got["files"]
        assert any(name.endswith(".distcp") for name in got["files"])
        assert not got["partial_left"]


@pytest.mark.parametrize("layout", ["tp2", "pp2", "prefix"])
def test_an_engine_from_the_checkpoint_gives_the_hf_models_log_probs(runs, layout):
    """tp2: the converter's layout; pp2: another (resharded on load); prefix: dist_checkpointing_prefix."""
    want, ranks = runs
    for got in ranks:
        assert_same(want["actor"], got[layout])


def test_a_critic_takes_its_trunk_from_the_checkpoint_and_its_head_from_hf(runs):
    want, ranks = runs
    for got in ranks:
        assert_same(want["critic"], got["critic"])


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing", "expected the folder of a megatron-core distributed checkpoint"),
        ("not_a_checkpoint", "no megatron-core distributed checkpoint there"),
        ("fewer_layers", "does not fit this model: CheckpointingException: Global shape mismatch"),
        ("untied", "does not fit this model: it lacks 1 tensors of this model, e.g. ['output_layer.weight']"),
    ],
)
def test_a_wrong_path_or_another_models_checkpoint_fails_naming_the_key(runs, case, says):
    for got in runs[1]:
        assert f"{KEY}.dist_checkpointing_path=" in got[case]
        assert says in got[case], got[case]
