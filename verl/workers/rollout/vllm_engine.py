"""Server mode over the ``vllm`` rollout's in-process engine: vLLM's own scheduler does the
continuous batching; we call its ``step()`` and read the new tokens of every request.

After a weight update the prefix cache is reset with the running requests preempted, so
vLLM recomputes their KV cache under the new weights before their next token (the tokens
they already have are kept, not resampled). Sampling uses the engine's RNG: unlike the hf
server, a request's tokens depend on what it was batched with.
"""

from __future__ import annotations

from verl.workers.rollout.server import Delta, GenerationRequest, StepEngine
from verl.workers.rollout.vllm_rollout import VLLMRollout


class VLLMStepEngine(StepEngine):
    def __init__(self, rollout: VLLMRollout, seeded: bool = False) -> None:
        """``seeded``: a sampled request draws from its own generator (``GenerationRequest.seed``), not
        from the engine's RNG, so that every rank of a tensor-parallel engine draws alike
        (:mod:`.tp_server` sets a seed on every request)."""
        self.rollout = rollout
        self.engine = rollout.llm.llm_engine
        self.seeded = seeded

    def add(self, request: GenerationRequest) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        extra = {"seed": request.seed} if self.seeded and request.params.do_sample else {}
        sampling = self.rollout._sampling_params(
            request.params,
            logprobs=0 if request.logprobs else None,
            output_kind=RequestOutputKind.DELTA,
            **extra,
        )
        self.engine.add_request(
            request.request_id,
            TokensPrompt(prompt_token_ids=request.prompt_ids),
            sampling,
            lora_request=self.rollout.lora_request,
        )

    def abort(self, request_id: str) -> None:
        self.engine.abort_request([request_id])

    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def weights_changed(self) -> None:
        self.engine.reset_prefix_cache(reset_running_requests=True)

    def step(self) -> list[Delta]:
        deltas = []
        for output in self.engine.step():
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            if completion.logprobs:
                log_probs = [step[token].logprob for step, token in zip(completion.logprobs, tokens)]
            else:
                log_probs = [0.0] * len(tokens)
            finish = completion.finish_reason if output.finished else None  # stop | length | abort
            deltas.append(Delta(output.request_id, tokens, log_probs, finish))
        return deltas
