"""Server mode over a tensor-parallel engine (``rollout.mode=async`` with
``rollout.tensor_model_parallel_size=T``): the first rank of each engine fronts the server, the
others replay its engine calls.

Every rank of a tensor-parallel vLLM engine holds an engine object that runs its shard, and the
shards stay in step only while every rank makes the same engine calls in the same order (SPMD,
:mod:`.tp_group`). In server mode the calls come from clients, at times only the first rank sees:

* the first rank runs the usual :class:`~.server.RolloutServer` and HTTP front over a
  :class:`LeaderEngine`, which broadcasts each engine call before making it. Requests added and
  aborted since the last message ride with the next one (one message per decoding step); a weight
  load, the prefix-cache reset after it, the probe and the server's end are messages of their own;
* every other rank runs a :class:`Follower`: a thread that receives the messages and makes the same
  calls on its engine, in the same order. What only that rank has (its own full tensors of a weight
  update, its own probe) its worker hands over (:meth:`Follower.update_weights`,
  :meth:`Follower.sequence_log_probs`); the follower uses it when the first rank's message comes;
* every sampled request carries a seed (the client's, else one the first rank draws) and draws from
  a generator of its own, so the ranks sample alike whatever else their processes run.

The messages travel on a gloo group of the engine's ranks kept for them (:func:`message_group`): they
never interleave with the engine's own collectives or the trainer's.
"""

from __future__ import annotations

import dataclasses
import queue
import random
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from verl.workers.rollout.probe import FingerprintSpec
from verl.workers.rollout.server import Delta, GenerationRequest, RolloutServer, ServerClosed, StepEngine
from verl.workers.rollout.tp_group import EngineGroup

STEP, LOAD, RESET, PROBE, STOP = "step", "load", "reset", "probe", "stop"
"""The engine calls a message stands for: a decoding step, a weight load, the prefix-cache reset after
it, the weight-sync probe, and the server's end."""

IDLE_LIMIT = timedelta(days=30)
"""How long a follower waits for the next message: as long as its server sits idle (gloo's default,
30 minutes, would end an idle server)."""


@dataclass
class EngineCall:
    """One message from the first rank: the adds and aborts since the last one, then ``kind``."""

    kind: str
    queued: list[tuple[str, Any]] = field(default_factory=list)
    """``("add", GenerationRequest)`` or ``("abort", request_id)``, in the order the first rank made them."""


class Channel:
    """The first rank's messages to the other ranks of its engine (``src``: its world rank)."""

    def __init__(self, group: dist.ProcessGroup, src: int) -> None:
        self.group, self.src = group, src

    def send(self, call: EngineCall) -> None:
        dist.broadcast_object_list([call], src=self.src, group=self.group)

    def receive(self) -> EngineCall:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.src, group=self.group)
        return box[0]


def message_group(tp: EngineGroup) -> dist.ProcessGroup:
    """A gloo group of ``tp``'s ranks for the messages (every rank of the world builds every
    engine's group, as ``torch.distributed`` asks)."""
    mine, world = None, dist.get_world_size()
    for first in range(0, world, tp.size):
        group = dist.new_group(list(range(first, first + tp.size)), backend="gloo", timeout=IDLE_LIMIT)
        if first == tp.ranks[0]:
            mine = group
    return mine


class LeaderEngine(StepEngine):
    """The first rank's step engine: each call is announced to the other ranks, then made on
    ``inner``. Its ``rollout`` announces the weight loads and probes the server makes."""

    def __init__(self, inner: StepEngine, channel: Channel, seed: int) -> None:
        self.inner, self.channel = inner, channel
        self.rollout = _AnnouncedRollout(inner.rollout, self)
        self._queued: list[tuple[str, Any]] = []
        self._seeds = random.Random(seed)  # the engine's seed: a restarted run draws the same

    def announce(self, kind: str) -> None:
        call, self._queued = EngineCall(kind, self._queued), []
        self.channel.send(call)

    def add(self, request: GenerationRequest) -> None:
        if request.params.do_sample and request.seed is None:
            request = dataclasses.replace(request, seed=self._seeds.randrange(2**31))
        self.inner.add(request)  # a request the engine refuses is not replayed
        self._queued.append(("add", request))

    def abort(self, request_id: str) -> None:
        self.inner.abort(request_id)
        self._queued.append(("abort", request_id))

    def has_work(self) -> bool:
        return self.inner.has_work()

    def step(self) -> list[Delta]:
        self.announce(STEP)
        return self.inner.step()

    def weights_changed(self) -> None:
        self.announce(RESET)
        self.inner.weights_changed()

    def stopped(self) -> None:
        self.announce(STOP)
        self.inner.stopped()


class _AnnouncedRollout:
    """The first rank's rollout as its server sees it: weight loads and probes are announced first."""

    def __init__(self, rollout: Any, leader: LeaderEngine) -> None:
        self._rollout, self._leader = rollout, leader

    @property
    def version(self) -> int:
        return self._rollout.version

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self._leader.announce(LOAD)
        self._rollout.update_weights(named_tensors, version)

    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        self._leader.announce(PROBE)
        return self._rollout.sequence_log_probs(token_ids)

    def weight_fingerprint(self, spec: FingerprintSpec) -> dict[str, int | None] | None:
        return self._rollout.weight_fingerprint(spec)  # None with tensor parallelism: no engine call


class Follower:
    """A rank of a tensor-parallel engine that does not front it: replays the first rank's engine
    calls on a thread of its own until the first rank's server stops. Quacks like the server for the
    worker's weight sync (``version``, ``update_weights``, ``sequence_log_probs``)."""

    def __init__(self, engine: StepEngine, channel: Channel) -> None:
        self.engine, self.rollout, self.channel = engine, engine.rollout, channel
        self.replayed = 0
        """Messages replayed so far."""
        self._handed: queue.Queue[tuple[str, Any, Future]] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._loop, name="rollout-follower", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the worker's side
    @property
    def version(self) -> int:
        return self.rollout.version

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load this rank's full tensors when the first rank loads its own."""
        self._hand(LOAD, lambda: self.rollout.update_weights(named_tensors, version))

    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        """Score this rank's probe when the first rank scores its own."""
        return self._hand(PROBE, lambda: self.rollout.sequence_log_probs(token_ids))

    def weight_fingerprint(self, spec: FingerprintSpec) -> dict[str, int | None] | None:
        return self.rollout.weight_fingerprint(spec)  # None with tensor parallelism: no engine call

    def close(self, timeout_s: float = 60.0) -> None:
        """Wait for the loop to end (it ends with the first rank's server)."""
        self._thread.join(timeout=timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _hand(self, kind: str, call: Callable[[], Any]) -> Any:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise ServerClosed("the rollout server of this tensor-parallel engine has stopped")
            self._handed.put((kind, call, future))
        return future.result()

    # ------------------------------------------------------------------ the replay
    def _loop(self) -> None:
        torch.set_num_threads(self._threads)  # as the server's thread: vLLM's CPU attention needs it
        error: BaseException = ServerClosed("the rollout server of this tensor-parallel engine has stopped")
        try:
            while self._replay(self.channel.receive()):
                self.replayed += 1
        except BaseException as failure:  # the worker's waiting calls hear why
            error = failure
        with self._lock:
            self._closed = True
        while not self._handed.empty():
            self._handed.get_nowait()[2].set_exception(error)

    def _replay(self, call: EngineCall) -> bool:
        for op, arg in call.queued:
            if op == "add":
                self.engine.add(arg)
            else:
                self.engine.abort(arg)
        if call.kind == STEP:
            self.engine.step()
        elif call.kind == RESET:
            self.engine.weights_changed()
        elif call.kind in (LOAD, PROBE):
            self._run_handed(call.kind)
        elif call.kind == STOP:
            self.engine.stopped()
            return False
        return True

    def _run_handed(self, kind: str) -> None:
        handed, call, future = self._handed.get()  # the worker's own part of the call
        if handed != kind:
            error = RuntimeError(f"the engine's first rank made a {kind} call where this rank had a {handed}")
            future.set_exception(error)
            raise error
        try:
            future.set_result(call())
        except BaseException as failure:
            future.set_exception(failure)
            raise


def build_tp_server(rollout: Any, config: Any, tokenizer: Any, model_name: str):
    """Server mode over ``rollout``'s tensor-parallel engine (``rollout.tp``): ``(server, front)`` on
    the engine's first rank, ``(follower, None)`` on the others."""
    from verl.workers.rollout.http_front import HTTPFront
    from verl.workers.rollout.vllm_engine import VLLMStepEngine

    tp: EngineGroup = rollout.tp
    channel = Channel(message_group(tp), tp.ranks[0])
    engine = VLLMStepEngine(rollout, seeded=True)
    if tp.rank > 0:
        return Follower(engine, channel), None
    server = RolloutServer(LeaderEngine(engine, channel, rollout.seed))
    return server, HTTPFront(server, tokenizer, config, model_name, config.server.timeout_s)
