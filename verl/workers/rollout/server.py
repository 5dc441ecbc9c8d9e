"""Server mode (``rollout.mode=async``): one request per sample, continuous batching.

A :class:`RolloutServer` drives a :class:`StepEngine` (one decoding step for every running
request at a time) from its own thread. Requests join and leave the running batch between
two steps, so a short answer comes back as soon as it is done while long ones go on.
Everything that touches the engine runs on that thread, between two steps:

* ``submit(request)`` queues a request and returns a future of its :class:`Completion`;
* ``update_weights(named_tensors, version)`` installs new weights. Requests in flight stay
  alive: the engine recomputes their KV cache under the new weights, and every token
  records the version that produced it (``Completion.versions``), so versions change inside
  a sequence when an update lands mid-generation;
* ``pause()`` returns once no step runs and none will start until ``resume()``; requests in
  flight are kept (a weight update in between is the use);
* ``sequence_log_probs`` scores the weight-sync probe under the current weights.

The server quacks like a :class:`Rollout` for the weight-sync check (``version``,
``update_weights``, ``sequence_log_probs``). The HTTP front (:mod:`.http_front`) and the
trainer's client (:mod:`.server_client`) talk to it.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.workers.rollout.base import Rollout
from verl.workers.rollout.probe import FingerprintSpec
from verl.workers.rollout.sampling import SamplingParams


@dataclass
class GenerationRequest:
    """Token ids in; ``params.response_length`` is the most tokens to generate. ``seed`` makes
    the sampled tokens a function of the request alone (hf), whatever else is batched with it."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: int | None = None
    logprobs: bool = True
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    multi_modal_inputs: dict[str, torch.Tensor] | None = None
    """A vision-language prompt's images (``pixel_values``, ``image_grid_thw``), in the order of its
    image blocks; only engines with ``takes_images`` accept them."""


@dataclass
class Completion:
    """Token ids out, each with its log-prob (under the sampling temperature) and the weight
    version that produced it. ``finish_reason``: ``stop`` (an EOS token, included), ``length``."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Delta:
    """What one engine step produced for one request."""

    request_id: str
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str | None = None


class StepEngine(ABC):
    """An inference engine driven one step at a time (continuous batching)."""

    rollout: Rollout
    takes_images: bool = False
    """Whether requests may carry images (``GenerationRequest.multi_modal_inputs``)."""

    @classmethod
    def create(cls, rollout: Rollout, config: Any) -> StepEngine:
        """The step engine over ``rollout`` (its backend's registry entry names this class);
        ``config`` is the rollout section."""
        return cls(rollout)

    @abstractmethod
    def add(self, request: GenerationRequest) -> None:
        """Queue a request; it joins the running batch at a coming step."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Forget a request (its client gave up)."""

    @abstractmethod
    def has_work(self) -> bool:
        """Requests waiting or running."""

    @abstractmethod
    def step(self) -> list[Delta]:
        """One decoding step for every running request."""

    @abstractmethod
    def weights_changed(self) -> None:
        """New weights were installed: KV caches of running requests are stale."""

    def stopped(self) -> None:
        """The server's loop has ended: nothing more will be asked of the engine (the other ranks
        of a tensor-parallel engine are told so, :mod:`.tp_server`)."""


class ServerClosed(RuntimeError):
    """The server stopped before the request finished."""


class RolloutServer:
    def __init__(self, engine: StepEngine) -> None:
        self.engine = engine
        self.rollout = engine.rollout
        self._cond = threading.Condition()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._new: deque[tuple[GenerationRequest, Future]] = deque()
        self._live: dict[str, tuple[Completion, Future]] = {}
        self._paused = False
        self._steps_left: int | None = None
        self._closed = False
        self.finished = 0
        self._threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._loop, name="rollout-server", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ requests
    def submit(self, request: GenerationRequest) -> Future:
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise ServerClosed("the rollout server is closed")
            self._new.append((request, future))
            self._cond.notify_all()
        return future

    def abort(self, request_id: str) -> None:
        self._run_on_loop(lambda: self._abort(request_id))

    def _abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        live = self._live.pop(request_id, None)
        if live is not None:
            live[0].finish_reason = "abort"
            live[1].set_result(live[0])

    # ------------------------------------------------------------------ control (between two steps)
    @property
    def version(self) -> int:
        return self.rollout.version

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        def install() -> None:
            self.rollout.update_weights(named_tensors, version)
            self.engine.weights_changed()

        self._run_on_loop(install)

    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        return self._run_on_loop(lambda: self.rollout.sequence_log_probs(token_ids))

    def weight_fingerprint(self, spec: FingerprintSpec) -> dict[str, int | None] | None:
        return self._run_on_loop(lambda: self.rollout.weight_fingerprint(spec))

    def pause(self) -> None:
        """Return once no step runs; none starts until :meth:`resume`. Requests are kept."""
        self._run_on_loop(lambda: setattr(self, "_paused", True))

    def resume(self, steps: int | None = None) -> None:
        """Go on stepping; with ``steps``, pause again after that many engine steps
        (:meth:`wait_paused` returns then): a deterministic way to stop mid-generation."""
        with self._cond:
            self._paused = False
            self._steps_left = steps
            self._cond.notify_all()

    def wait_paused(self, timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._paused or self._closed, timeout):
                raise TimeoutError(f"the rollout server did not pause within {timeout} s")

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "running": len(self._live),
                "queued": len(self._new),
                "finished": self.finished,
                "version": self.version,
                "paused": int(self._paused),
            }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def _run_on_loop(self, fn: Callable[[], Any]) -> Any:
        if threading.current_thread() is self._thread:
            return fn()
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise ServerClosed("the rollout server is closed")
            self._calls.append((fn, future))
            self._cond.notify_all()
        return future.result()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        # OpenMP's thread count is per thread, and a new one starts from OMP_NUM_THREADS: vLLM's CPU
        # attention fails when it differs from the count the engine was built with (this thread's creator's)
        torch.set_num_threads(self._threads)
        try:
            while self._next_round():
                pass
        finally:
            self._fail_all(ServerClosed("the rollout server stopped"))
            self.engine.stopped()

    def _next_round(self) -> bool:
        """Wait for something to do; run control calls, admit requests, run one step."""
        with self._cond:
            while not (self._closed or self._calls or self._new or (self._can_step())):
                self._cond.wait()
            if self._closed:
                return False
            calls, self._calls = self._calls, deque()
            new, self._new = self._new, deque()
        for fn, future in calls:
            _run_into(fn, future)
        for request, future in new:
            self._admit(request, future)
        if self._can_step():
            self._step()
        return True

    def _can_step(self) -> bool:
        return not self._paused and bool(self._live)

    def _admit(self, request: GenerationRequest, future: Future) -> None:
        try:
            self.engine.add(request)
        except Exception as error:  # a bad request fails alone
            future.set_exception(error)
            return
        self._live[request.request_id] = (Completion(request.request_id, list(request.prompt_ids)), future)

    def _step(self) -> None:
        try:
            deltas = self.engine.step()
        except Exception as error:  # the engine is broken: every waiting client hears why
            self._fail_all(error)
            return
        version = self.version  # weights change only between steps, on this thread
        if self._steps_left is not None:
            self._steps_left -= 1
            if self._steps_left <= 0:
                with self._cond:
                    self._paused, self._steps_left = True, None
                    self._cond.notify_all()
        for delta in deltas:
            live = self._live.get(delta.request_id)
            if live is None:
                continue
            completion, future = live
            completion.token_ids += delta.token_ids
            completion.log_probs += delta.log_probs
            completion.versions += [version] * len(delta.token_ids)
            if delta.finish_reason is not None:
                completion.finish_reason = delta.finish_reason
                del self._live[delta.request_id]
                self.finished += 1
                future.set_result(completion)

    def _fail_all(self, error: BaseException) -> None:
        for request_id in list(self._live):
            with contextlib.suppress(Exception):  # the engine may be what failed; clients still hear why
                self.engine.abort(request_id)
        for _, future in list(self._live.values()):
            if not future.done():
                future.set_exception(error)
        self._live.clear()
        with self._cond:
            pending = list(self._new) + [(None, f) for _, f in self._calls]
            self._new.clear()
            self._calls.clear()
        for _, future in pending:
            if not future.done():
                future.set_exception(error)


def _run_into(fn: Callable[[], Any], future: Future) -> None:
    try:
        future.set_result(fn())
    except BaseException as error:
        future.set_exception(error)
