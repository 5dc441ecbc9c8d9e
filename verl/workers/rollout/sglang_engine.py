"""Server mode over the ``sglang`` rollout's engine. CUDA only, and not run by this project's tests
(see :mod:`.sglang_rollout`).

SGLang schedules its own continuous batch in its scheduler process, so "one step" here is: let the
engine's event loop run until some request has produced new tokens, and hand those over. Each
request is one streamed ``async_generate`` call (token ids in; cumulative ids and log-probs out,
of which the new ones are taken). Every call into the engine happens on the rollout server's
thread, which is also the only thread that runs the engine's event loop; weight updates pause
generation in ``retract`` mode (see :meth:`SGLangRollout.update_weights`), so requests in flight
keep their tokens and go on under the new weights, and tokens produced after the update carry
the new version.
"""

from __future__ import annotations

import asyncio

from verl.workers.rollout.server import Delta, GenerationRequest, StepEngine
from verl.workers.rollout.sglang_rollout import SGLangRollout, finish_reason, output_tokens, sampling_params

POLL_S = 0.002  # how long one step lets the engine's loop run when nothing has arrived yet


class SGLangStepEngine(StepEngine):
    def __init__(self, rollout: SGLangRollout) -> None:
        self.rollout = rollout
        self.engine = rollout.engine
        self._tasks: dict[str, asyncio.Task] = {}
        self._deltas: list[Delta] = []

    def add(self, request: GenerationRequest) -> None:
        self._tasks[request.request_id] = self.engine.loop.create_task(self._stream(request))

    async def _stream(self, request: GenerationRequest) -> None:
        sampling = sampling_params(request.params, self.rollout.eos_token_ids, request.seed)
        stream = await self.engine.async_generate(
            input_ids=request.prompt_ids,
            sampling_params=sampling,
            return_logprob=request.logprobs,
            stream=True,
            rid=request.request_id,
        )
        seen = 0
        async for chunk in stream:
            tokens, log_probs = output_tokens(chunk, request.logprobs)
            reason = finish_reason(chunk)
            if len(tokens) > seen or reason is not None:
                self._deltas.append(Delta(request.request_id, tokens[seen:], log_probs[seen:], reason))
                seen = len(tokens)

    def abort(self, request_id: str) -> None:
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()
            self.engine.tokenizer_manager.abort_request(rid=request_id)

    def has_work(self) -> bool:
        return bool(self._tasks or self._deltas)

    def weights_changed(self) -> None:
        """Nothing left to do: the update ran with generation paused (retract) and flushed the cache."""

    def step(self) -> list[Delta]:
        while not self._deltas and self._tasks:
            self.engine.loop.run_until_complete(asyncio.sleep(POLL_S))
            for request_id, task in list(self._tasks.items()):
                if task.done():
                    del self._tasks[request_id]
                    task.result()  # a failed request fails the step, with the engine's error
        deltas, self._deltas = self._deltas, []
        return deltas
