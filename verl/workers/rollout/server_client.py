"""The trainer's side of server mode: a batch of prompts becomes one request per sample.

:class:`ServerRolloutClient` has the ``generate_sequences(prompts) -> DataProto`` of a
rollout worker group, so the trainers and the validator use either. Each row (left padding
stripped) is sent to ``POST /generate`` of the replica with the fewest requests in flight;
rows come back in any order (a short answer does not wait for a long one) and are put
back in batch order in the layout of :func:`verl.workers.rollout.base.response_tensors`.

With ``meta_info["sampling_seed"]`` each row gets the seed ``derived_seed(sampling_seed, row)``: on the hf server a row's tokens then depend on the step and the row only.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from verl.config.rollout import RolloutConfig
from verl.protocol import DataProto
from verl.workers.rollout.base import response_tensors
from verl.workers.rollout.sampling import derived_seed

MAX_CONCURRENCY = 256  # requests in flight from one client (threads, each waiting on one HTTP call)
SAMPLING_META = ("temperature", "top_p", "top_k", "do_sample", "validate")


class RolloutServerError(RuntimeError):
    """A rollout server refused or failed a request."""


class ServerRolloutClient:
    def __init__(
        self, addresses: list[str], config: RolloutConfig, pad_token_id: int, eos_token_ids: list[int]
    ) -> None:
        if not addresses:
            raise ValueError("server mode needs at least one rollout server address")
        self.addresses = list(addresses)
        self.pad_token_id = pad_token_id
        self.eos_token_ids = [-1] if config.ignore_eos else list(eos_token_ids)
        self.response_length = config.response_length
        self.timeout_s = config.server.timeout_s
        self.with_log_probs = config.calculate_log_probs
        self.in_flight = dict.fromkeys(self.addresses, 0)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENCY, thread_name_prefix="rollout-client")
        self._batches = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollout-batch")

    def generate_sequences(self, prompts: DataProto, blocking: bool = True) -> DataProto | PendingBatch:
        if blocking:
            return self._generate(prompts)
        return PendingBatch(self._batches.submit(self._generate, prompts))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._batches.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ one batch
    def _generate(self, prompts: DataProto) -> DataProto:
        meta = prompts.meta_info
        body = {k: meta[k] for k in SAMPLING_META if k in meta}
        length = int(meta.get("response_length", self.response_length))
        body["max_tokens"] = length
        want_log_probs = self.with_log_probs and not meta.get("validate")
        body["logprobs"] = want_log_probs
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
        seed = meta.get("sampling_seed")
        futures = []
        for row, (row_ids, row_mask) in enumerate(zip(ids, mask)):
            request = {**body, "prompt_ids": row_ids[row_mask].tolist()}
            if seed is not None:
                request["seed"] = derived_seed(seed, row)
            futures.append(self._pool.submit(self._post, request))
        completions = [f.result() for f in futures]  # each request has its own timeout
        return self._assemble(prompts, completions, length, want_log_probs)

    def _post(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:  # the replica with the fewest requests in flight
            address = min(self.addresses, key=lambda a: self.in_flight[a])
            self.in_flight[address] += 1
        try:
            return post_json(f"{address}/generate", request, self.timeout_s)
        finally:
            with self._lock:
                self.in_flight[address] -= 1

    def _assemble(
        self, prompts: DataProto, completions: list[dict[str, Any]], length: int, with_log_probs: bool
    ) -> DataProto:
        p = prompts.batch
        batch = len(completions)
        responses = torch.full((batch, length), self.pad_token_id, dtype=p["input_ids"].dtype)
        log_probs = torch.zeros(batch, length)
        versions = torch.zeros(batch, length, dtype=torch.long)
        for i, c in enumerate(completions):
            n = min(len(c["token_ids"]), length)
            responses[i, :n] = torch.tensor(c["token_ids"][:n], dtype=responses.dtype)
            log_probs[i, :n] = torch.tensor(c["log_probs"][:n])
            row_versions = c["token_versions"][:n] or [0]
            versions[i] = row_versions[-1]  # padding takes the last version (masked to -1 below)
            versions[i, :n] = torch.tensor(row_versions[:n])
        tensors = response_tensors(
            p["input_ids"], p["attention_mask"], p["position_ids"], responses, versions, self.eos_token_ids
        )
        if with_log_probs:
            tensors["rollout_log_probs"] = log_probs * tensors["response_mask"]
        return DataProto.from_dict(tensors, meta_info={"metrics": {}})


class PendingBatch:
    """A batch being generated (``get()`` waits for it), like a worker group's future."""

    def __init__(self, future: Future) -> None:
        self.future = future

    def get(self, timeout_s: float | None = None) -> DataProto:
        return self.future.result(timeout=timeout_s)

    def add_done_callback(self, fn: Callable[[PendingBatch], None]) -> None:
        """Call ``fn(self)`` once the batch is done (at once if it is), with its responses or its error."""
        self.future.add_done_callback(lambda _: fn(self))


# the rollout servers listen on this machine: an http(s)_proxy in the environment must not reroute them
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_json(url: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST ``payload`` as JSON; an HTTP error becomes a :class:`RolloutServerError` with the
    server's message."""
    data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with _LOOPBACK.open(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):
            detail = json.loads(detail)["error"]["message"]
        raise RolloutServerError(f"{url} answered {error.code}: {detail}") from None
    except OSError as error:  # refused, reset, timed out
        raise RolloutServerError(
            f"{url} did not answer within {timeout_s} s ({error}); is the rollout worker alive? "
            "(actor_rollout_ref.rollout.server.timeout_s)"
        ) from None
