"""Two gloo ranks of a recording engine (no vLLM) for the replay test of
:mod:`verl.workers.rollout.tp_server` (``tests/workers/rollout/test_vllm_tp_server.py``); a module of its
own so that the spawned ranks import only what they run."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from verl.workers.rollout.sampling import SamplingParams
from verl.workers.rollout.server import Delta, GenerationRequest, StepEngine

TIMEOUT = 120  # only catches a hang


class RecordingRollout:
    seed = 3

    def __init__(self, calls: list) -> None:
        self.calls, self.version = calls, 0

    def update_weights(self, named_tensors, version: int) -> None:
        self.calls.append(["load", sorted(name for name, _ in named_tensors), version])
        self.version = version

    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        self.calls.append(["probe"])  # each rank scores its own probe
        return torch.zeros(len(token_ids) - 1)

    def weight_fingerprint(self, spec):
        return None


class RecordingEngine(StepEngine):
    """Records its calls; each step gives every running request one token."""

    def __init__(self) -> None:
        self.calls: list = []
        self.rollout = RecordingRollout(self.calls)
        self.left: dict[str, int] = {}

    def add(self, request: GenerationRequest) -> None:
        self.calls.append(["add", request.request_id, request.seed])
        self.left[request.request_id] = request.params.response_length

    def abort(self, request_id: str) -> None:
        self.calls.append(["abort", request_id])
        self.left.pop(request_id, None)

    def has_work(self) -> bool:
        return bool(self.left)

    def step(self) -> list[Delta]:
        self.calls.append(["step"])
        deltas = []
        for request_id in list(self.left):
            self.left[request_id] -= 1
            done = self.left[request_id] == 0
            deltas.append(Delta(request_id, [7], [-0.5], "length" if done else None))
            if done:
                del self.left[request_id]
        return deltas

    def weights_changed(self) -> None:
        self.calls.append(["reset"])


def _request(length: int, seed: int | None = None) -> GenerationRequest:
    return GenerationRequest([1, 2], SamplingParams(True, 1.0, -1, 1.0, length, True, False), seed)


def replay_rank(rank: int, port: int, out: str) -> None:
    """Rank 0 serves requests, aborts one, loads weights and probes; rank 1 replays; each writes
    the calls its engine saw to ``out/<rank>.json``."""
    import torch.distributed as dist

    from verl.workers.rollout.server import RolloutServer
    from verl.workers.rollout.tp_group import EngineGroup
    from verl.workers.rollout.tp_server import Channel, Follower, LeaderEngine, message_group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tp = EngineGroup(dist.new_group([0, 1], backend="gloo"), 2, rank, (0, 1))
    channel, engine = Channel(message_group(tp), 0), RecordingEngine()
    weights = [("w", torch.ones(1))]
    if rank == 0:
        server = RolloutServer(LeaderEngine(engine, channel, RecordingRollout.seed))
        server.pause()
        long_request = _request(50, seed=11)
        short, long = server.submit(_request(2)), server.submit(long_request)
        server.resume(steps=3)
        server.wait_paused(TIMEOUT)
        server.abort(long_request.request_id)
        server.update_weights(weights, 1)
        server.sequence_log_probs([1, 2, 3])
        server.resume()
        assert len(short.result(TIMEOUT).token_ids) == 2 and long.result(TIMEOUT).finish_reason == "abort"
        server.close()
    else:
        follower = Follower(engine, channel)
        follower.update_weights(weights, 1)
        follower.sequence_log_probs([4, 5])
        follower.close(TIMEOUT)
        assert not follower.running and follower.version == 1
    Path(out, f"{rank}.json").write_text(json.dumps(engine.calls))
    dist.destroy_process_group()
