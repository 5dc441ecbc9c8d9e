"""The Megatron engine equals the FSDP engine on the same weights and batch (CPU, fp32, gloo).

For tensor parallel 2, pipeline parallel 2 and both (4 ranks), the actor's log-probs and entropy,
its loss and gradient norm over two micro-batches, and the weights after one AdamW step; and the
critic's values, loss and gradient norm: all within 1e-5 of a single-rank FSDP engine (plain torch).
Real megatron-core 0.16.1 over gloo, behind the test-only CPU shim (tests/megatron/cpu_shim.py)."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.megatron.ranks import run_ranks

TOL = 1e-5
PROMPT, RESPONSE, VOCAB = 6, 5, 95  # odd: tensor parallelism pads the vocabulary


def tiny_config(value_head: bool):
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=not value_head,
        num_labels=1,
        classifier_dropout=0.0,
    )
    config.token_classification_bias = False
    return config


def build_hf(config, value_head: bool, state=None):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    torch.manual_seed(0)
    cls = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    module = cls.from_config(config, attn_implementation="eager").float()
    if state is not None:
        module.load_state_dict(state)
    return module


def batch(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Two micro-batches of left-padded prompts and right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    micros = []
    for rows in (3, 2):
        ids = torch.randint(1, VOCAB, (rows, PROMPT + RESPONSE), generator=g)
        mask = torch.ones_like(ids)
        mask[0, :2] = 0  # a padded prompt
        mask[-1, -2:] = 0  # a short response
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        micros.append(
            {
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": pos,
                "responses": ids[:, PROMPT:],
                "response_mask": mask[:, PROMPT:].float(),
                "advantages": torch.randn(rows, RESPONSE, generator=g),
            }
        )
    return micros


def actor_outputs(module, micro):
    from verl.workers.forward import EntropyOptions, response_log_probs

    return response_log_probs(module, micro, 0.9, EntropyOptions())


def actor_loss(module, micro):
    out = actor_outputs(module, micro)
    mask = micro["response_mask"]
    loss = -((out["log_probs"] * micro["advantages"] + 0.01 * out["entropys"]) * mask).sum() / mask.sum()
    return loss, {"loss": loss.detach()}


def critic_outputs(module, micro):
    from verl.workers.forward import response_values

    return {"values": response_values(module, micro)}


def critic_loss(module, micro):
    values = critic_outputs(module, micro)["values"]
    mask = micro["response_mask"]
    loss = ((values - micro["advantages"]).square() * mask).sum() / mask.sum()
    return loss, {"loss": loss.detach()}


FNS = {False: (actor_outputs, actor_loss), True: (critic_outputs, critic_loss)}


def optim_config():
    from verl.config.engine import OptimConfig

    return OptimConfig(lr=1e-3, weight_decay=0.01)


def run_engine(engine, value_head: bool) -> dict:
    infer_fn, loss_fn = FNS[value_head]
    micros = batch()
    outs = engine.infer(micros, infer_fn)
    metrics = engine.train_step(micros, loss_fn, [0.6, 0.4])
    weights = {name: t.detach().clone().float() for name, t in engine.full_state_dict()}
    return {"outs": outs, "metrics": metrics, "weights": weights}


def fsdp_reference(value_head: bool) -> dict:
    from verl.config.engine import FSDPConfig
    from verl.workers.engine.fsdp import FSDPEngine

    config = tiny_config(value_head)
    module = build_hf(config, value_head)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    engine = FSDPEngine(module, torch.device("cpu"), FSDPConfig(), optim=optim_config(), grad_clip=1.0)
    return {"state": state, **run_engine(engine, value_head)}


def megatron_engine(tp, pp, distributed_optimizer, value_head, state):
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.engine import MegatronEngine

    module = build_hf(tiny_config(value_head), value_head, state)
    megatron = MegatronConfig(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        use_distributed_optimizer=distributed_optimizer,
    )
    return MegatronEngine(
        module, torch.device("cpu"), megatron, "test.megatron", optim=optim_config(), value_head=value_head
    )


def megatron_rank(rank, world, layouts, states, resume_folder):
    """Each of ``layouts`` (as many ranks each) in turn in one set of processes, megatron-core's groups
    rebuilt in between: the actor's and the critic's run, and on pp2 the resume check."""
    from megatron.core import parallel_state as ps

    out = {}
    for name, (tp, pp, distributed_optimizer) in layouts.items():
        out[name] = {}
        for value_head, state in states.items():
            out[name][value_head] = run_engine(
                megatron_engine(tp, pp, distributed_optimizer, value_head, state), value_head
            )
        if name == "pp2":
            engine = functools.partial(megatron_engine, tp, pp, distributed_optimizer, False, states[False])
            out[name]["resume"] = resume(resume_folder, engine)
        ps.destroy_model_parallel()
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@pytest.fixture(scope="module")
def references():
    return {value_head: fsdp_reference(value_head) for value_head in (False, True)}


# (tensor, pipeline, distributed optimizer); the saved-engine resume runs on pp2 (plain optimizer)
LAYOUTS = {"tp2": (2, 1, True), "pp2": (1, 2, False), "tp2xpp2": (2, 2, True)}


@pytest.fixture(scope="module")
def megatron_runs(references, tmp_path_factory):
    """Each layout's ranks, run once for every test that reads them: one spawn per number of ranks
    (tp2 and pp2 share theirs, which saves starting two processes)."""
    runs = {}

    def get(layout: str) -> list[dict]:
        if layout not in runs:
            tp, pp, _ = LAYOUTS[layout]
            same_size = {name: sizes for name, sizes in LAYOUTS.items() if sizes[0] * sizes[1] == tp * pp}
            states = {value_head: ref["state"] for value_head, ref in references.items()}
            folder = str(tmp_path_factory.mktemp("resume"))
            ranks = run_ranks(megatron_rank, tp * pp, same_size, states, folder)
            runs.update({name: [got[name] for got in ranks] for name in same_size})
        return runs[layout]

    return get


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("value_head", [False, True], ids=["actor", "critic"])
def test_megatron_equals_fsdp(references, megatron_runs, layout, value_head):
    ref = references[value_head]
    results = [got[value_head] for got in megatron_runs(layout)]
    masks = [micro["response_mask"] for micro in batch()]  # what pads predict is read by no one
    for rank, got in enumerate(results):  # every rank returns the whole model-parallel group's rows
        for want, have, mask in zip(ref["outs"], got["outs"], masks):
            assert want.keys() == have.keys()
            for key in want:
                assert close(want[key] * mask, have[key] * mask) < TOL, (rank, key)
        for key in ("loss", "grad_norm"):
            assert abs(ref["metrics"][key] - got["metrics"][key]) < TOL, (
                rank,
                key,
                ref["metrics"],
                got["metrics"],
            )
        assert ref["weights"].keys() == got["weights"].keys()
        for name, tensor in ref["weights"].items():
            assert close(tensor, got["weights"][name]) < TOL, (rank, name)
    # the step moved the weights (the comparison above is not of two untouched copies)
    moved = max(close(ref["state"][n], t) for n, t in ref["weights"].items())
    assert moved > 1e-4


def resume(folder, engine):
    """Train a step, save, train another; a fresh engine loads the save and trains the same step."""
    first, micros = engine(), batch()
    first.train_step(micros, actor_loss, [0.6, 0.4])
    first.lr_scheduler_step()
    first.save(folder, ["model", "optimizer", "extra"])
    want = first.train_step(micros, actor_loss, [0.6, 0.4])
    second = engine()
    second.load(folder, ["model", "optimizer", "extra"])
    have = second.train_step(micros, actor_loss, [0.6, 0.4])
    same = all(torch.equal(a, b) for (_, a), (_, b) in zip(first.full_state_dict(), second.full_state_dict()))
    return want, have, same


def test_a_saved_engine_resumes_bit_for_bit(megatron_runs):
    """Pipeline parallel with megatron's plain (not distributed) optimizer; the distributed one is
    resumed by tests/trainer/test_megatron_resume.py."""
    for got in megatron_runs("pp2"):
        want, have, same = got["resume"]
        assert want == have and same
