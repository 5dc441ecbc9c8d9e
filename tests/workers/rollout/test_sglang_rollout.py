"""The ``sglang`` rollout.

SGLang runs on CUDA only, and neither this project's CI nor its GPU machines have it, so the tests
here are of two kinds, said plainly:

* CPU tests of what this project's code does around the engine: the start-up errors, verl's keys to
  ``sglang.Engine`` arguments, sampling parameters, the parsing of SGLang's output dicts (the shapes
  its ``Engine.generate`` documents), weight buckets, the response layout; and the server-mode
  adapter driven by a small asyncio engine that streams cumulative outputs the way SGLang's
  tokenizer manager does. That engine is a stand-in, used only because SGLang cannot run here;
* a GPU test on the real engine (marked ``gpu``; it also skips where SGLang is not installed).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.workers.rollout import build_rollout
from verl.workers.rollout.sampling import SamplingParams
from verl.workers.rollout.server import GenerationRequest
from verl.workers.rollout.sglang_engine import SGLangStepEngine
from verl.workers.rollout.sglang_rollout import (
    SGLangRollout,
    buckets,
    engine_args,
    finish_reason,
    output_tokens,
    sampling_params,
)

EOS = 2


def rollout_config(*overrides: str):
    return load_config(["actor_rollout_ref.rollout.name=sglang", *overrides]).actor_rollout_ref.rollout


def test_on_cpu_the_rollout_says_it_needs_cuda(builtin_assets):
    config = load_config(["actor_rollout_ref.rollout.name=sglang"]).actor_rollout_ref
    from verl.utils.model import load_tokenizer

    tokenizer = load_tokenizer(config.model.path)
    with pytest.raises(RuntimeError, match=r"rollout\.name=sglang runs on CUDA only.*vllm"):
        build_rollout(config.rollout, config.model, tokenizer, torch.device("cpu"), 0)


def test_tensor_parallel_engines_are_refused_at_start_up():
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size.*1 with rollout\.name=sglang"):
        rollout_config("actor_rollout_ref.rollout.tensor_model_parallel_size=2")


def test_verl_rollout_keys_become_engine_arguments():
    config = rollout_config(
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "actor_rollout_ref.rollout.enable_prefix_caching=False",
        "actor_rollout_ref.rollout.enable_chunked_prefill=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.load_format=dummy_dtensor",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
        "data.max_prompt_length=32",
        "data.max_response_length=96",
    )
    args = engine_args(config, "/models/m", seed=7, trust_remote_code=True, port=31000)
    assert args["mem_fraction_static"] == 0.6 and args["max_running_requests"] == 64
    assert args["disable_radix_cache"] and args["chunked_prefill_size"] == -1
    assert not args["enable_memory_saver"] and args["load_format"] == "dummy"
    assert (args["context_length"], args["random_seed"], args["port"]) == (128, 7, 31000)
    assert args["skip_tokenizer_init"] and args["trust_remote_code"] and args["tp_size"] == 1
    assert args["disable_cuda_graph"] and args["attention_backend"] == "fa3"  # engine_kwargs.sglang: as given


def test_sampling_parameters():
    sample = SamplingParams(True, 0.7, 5, 0.9, 16, False, False)
    assert sampling_params(sample, [EOS], seed=3) == {
        "max_new_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "ignore_eos": False,
        "stop_token_ids": [EOS],
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "sampling_seed": 3,
    }
    greedy = sampling_params(SamplingParams(False, 0.7, 5, 0.9, 16, True, True), [EOS])
    assert (greedy["temperature"], greedy["top_k"], greedy["top_p"]) == (0.0, -1, 1.0)
    assert greedy["stop_token_ids"] == [] and greedy["ignore_eos"] and "sampling_seed" not in greedy


def sglang_output(tokens: list[int], log_probs: list[float], reason: str | None) -> dict:
    """An output dict as ``sglang.Engine.generate`` returns it with ``skip_tokenizer_init``."""
    entries = [(lp, token, None) for lp, token in zip(log_probs, tokens)]
    finish = (
        None if reason is None else {"type": reason, "matched": EOS} if reason == "stop" else {"type": reason}
    )
    return {"output_ids": tokens, "meta_info": {"output_token_logprobs": entries, "finish_reason": finish}}


def test_outputs_are_parsed_into_tokens_log_probs_and_finish_reasons():
    out = sglang_output([5, 6, EOS], [-0.1, -0.2, -0.3], "stop")
    assert output_tokens(out, True) == ([5, 6, EOS], [-0.1, -0.2, -0.3])
    assert output_tokens(out, False) == ([5, 6, EOS], [0.0, 0.0, 0.0])
    assert finish_reason(out) == "stop"
    assert finish_reason(sglang_output([5], [-1.0], "length")) == "length"
    assert finish_reason(sglang_output([5], [-1.0], None)) is None


def test_weights_go_over_in_buckets_in_order():
    tensors = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 5])]  # float32: 4 bytes
    groups = [[name for name, _ in bucket] for bucket in buckets(iter(tensors), max_bytes=80)]
    assert groups == [["w0", "w1"], ["w2"], ["w3", "w4"]]  # w2 (120 bytes) goes alone
    assert [name for group in groups for name in group] == [name for name, _ in tensors]


def test_responses_take_the_rollout_layout():
    rollout = SGLangRollout.__new__(SGLangRollout)  # the layout code only; no engine on CPU
    rollout.pad_token_id, rollout.eos_token_ids = 0, [EOS]
    ids = torch.tensor([[0, 7, 8], [9, 7, 8]])
    mask = (ids != 0).long()
    prompts = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1}
    )
    outputs = [
        sglang_output([5, EOS], [-0.5, -0.25], "stop"),
        sglang_output([4, 4, 4, 4, 4], [-1.0] * 5, "length"),
    ]
    params = SamplingParams(True, 1.0, -1, 1.0, 4, False, False)
    rows = [output_tokens(output, with_log_probs=True) for output in outputs]
    out = rollout.assemble(prompts, rows, params, with_log_probs=True, version=3).batch
    assert out["responses"].tolist() == [[5, EOS, 0, 0], [4, 4, 4, 4]]
    assert out["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert out["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0] * 4]
    assert out["response_versions"].tolist() == [[3, 3, -1, -1], [3] * 4]


class StreamingEngine:
    """Stand-in for ``sglang.Engine`` in server mode (SGLang cannot run here): ``async_generate``
    with ``stream=True`` yields cumulative ``output_ids`` and log-probs, one token per engine tick;
    ``tokenizer_manager.abort_request`` is recorded."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.tokenizer_manager = self
        self.aborted: list[str] = []

    def abort_request(self, rid: str) -> None:
        self.aborted.append(rid)

    async def async_generate(self, input_ids, sampling_params, return_logprob, stream, rid):
        assert stream and sampling_params["stop_token_ids"] == [EOS]
        if len(input_ids) > 4:
            raise ValueError(f"the input ({len(input_ids)} tokens) is longer than the context length (4)")

        async def chunks():
            tokens: list[int] = []
            for step in range(sampling_params["max_new_tokens"]):
                await asyncio.sleep(0)
                tokens = [*tokens, 10 + step]
                done = step + 1 == sampling_params["max_new_tokens"]
                yield sglang_output(tokens, [-0.1 * t for t in tokens], "length" if done else None)

        return chunks()


class EngineRollout:
    def __init__(self) -> None:
        self.engine = StreamingEngine()
        self.eos_token_ids = [EOS]


def drain(engine: SGLangStepEngine) -> dict[str, list]:
    """Step until no work is left; per request, the concatenated deltas and the finish reasons seen
    (how many tokens one step brings depends on timing; what they add up to does not)."""
    seen: dict[str, list] = {}
    for _ in range(1000):
        if not engine.has_work():
            return seen
        for delta in engine.step():
            tokens, log_probs, reasons = seen.setdefault(delta.request_id, [[], [], []])
            tokens += delta.token_ids
            log_probs += delta.log_probs
            reasons.append(delta.finish_reason)
    raise AssertionError("the adapter still has work after 1000 steps")


def request(max_tokens: int) -> GenerationRequest:
    return GenerationRequest([1, 2], SamplingParams(True, 1.0, -1, 1.0, max_tokens, False, False))


def test_the_server_adapter_turns_cumulative_streams_into_deltas():
    engine = SGLangStepEngine(EngineRollout())
    short, long = request(2), request(9)
    engine.add(short)
    engine.add(long)
    seen = drain(engine)
    tokens, log_probs, reasons = seen[long.request_id]
    assert tokens == list(range(10, 19))  # each token once, in order
    assert log_probs == pytest.approx([-0.1 * t for t in tokens])
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}
    assert seen[short.request_id][0] == [10, 11] and seen[short.request_id][2][-1] == "length"


def test_an_aborted_request_is_dropped_and_reported_to_the_engine():
    engine = SGLangStepEngine(EngineRollout())
    kept, dropped = request(3), request(50)
    engine.add(kept)
    engine.add(dropped)
    engine.abort(dropped.request_id)
    seen = drain(engine)
    assert engine.engine.aborted == [dropped.request_id]
    assert dropped.request_id not in seen and seen[kept.request_id][0] == [10, 11, 12]


def test_a_failing_stream_fails_the_step_with_the_engines_error():
    engine = SGLangStepEngine(EngineRollout())
    engine.add(GenerationRequest([1] * 5, SamplingParams(True, 1.0, -1, 1.0, 2, False, False)))
    with pytest.raises(ValueError, match="longer than the context length"):
        drain(engine)


@pytest.mark.gpu
def test_the_real_engine_generates_syncs_weights_and_scores_the_probe(builtin_assets):
    pytest.importorskip("sglang", reason="SGLang is not installed on this machine")
    from transformers import AutoModelForCausalLM

    from verl.utils.model import load_tokenizer

    config = load_config(
        [
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.rollout.load_format=auto",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        ]
    ).actor_rollout_ref
    tokenizer = load_tokenizer(config.model.path)
    rollout = build_rollout(config.rollout, config.model, tokenizer, torch.device("cuda"), 0)
    try:
        ids = tokenizer(["3+4=", "9+9="], add_special_tokens=False, return_tensors="pt", padding=True)
        mask = ids["attention_mask"]
        prompts = DataProto.from_dict(
            {"input_ids": ids["input_ids"], "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
            meta_info={"do_sample": False},
        )
        out = rollout.generate_sequences(prompts).batch
        assert out["responses"].shape[0] == 2 and out["response_mask"].sum() > 0
        model = AutoModelForCausalLM.from_pretrained(config.model.path, torch_dtype=torch.float32)
        probe = tokenizer("12+30=42", add_special_tokens=False)["input_ids"]
        before = rollout.sequence_log_probs(probe)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
        rollout.update_weights(((k, v.cuda()) for k, v in model.state_dict().items()), version=1)
        after = rollout.sequence_log_probs(probe)
        assert rollout.version == 1 and not torch.allclose(before, after, atol=1e-3)
    finally:
        rollout.close()


@pytest.mark.parametrize(
    ("name", "given", "noted"),
    [
        ("sglang", "actor_rollout_ref.rollout.layered_summon=True", True),
        ("sglang", "actor_rollout_ref.rollout.update_weights_bucket_megabytes=256", False),
        ("vllm", "actor_rollout_ref.rollout.update_weights_bucket_megabytes=256", True),
    ],
)
def test_keys_without_effect_for_the_engine_are_noted(name, given, noted):
    overrides = [f"actor_rollout_ref.rollout.name={name}", given]
    notes = " ".join(
        n for n in log_config_notes(load_config(overrides), "cuda", overrides) if "no effect" in n
    )
    assert (given.split("=")[0] in notes) == noted
