"""What generates a batch for the trainer: one interface (:class:`RolloutClient`), three clients.

* :class:`WorkerGroupClient` (``rollout.mode=sync``): one batched call to the rollout worker group;
* :class:`~verl.workers.rollout.server_client.ServerRolloutClient` (``async``): one request per
  sample to the servers the rollout ranks run;
* :class:`~verl.experimental.agent_loop.manager.AgentLoopManager` (``async`` with agent loops): one
  agent loop per row, talking to the same servers.

The trainer and the validator hold a ``RolloutClient`` and know nothing of which one it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, overload

from verl.protocol import DataProto


class PendingGeneration(Protocol):
    """A batch being generated; ``get()`` waits for it (with a time-out, or forever)."""

    def get(self, timeout_s: float | None = None) -> DataProto: ...

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(self)`` once done (server-mode clients: the streaming trainer takes batches as
        they finish)."""
        ...


class RolloutClient(Protocol):
    @overload
    def generate_sequences(self, prompts: DataProto, blocking: Literal[True] = ...) -> DataProto: ...

    @overload
    def generate_sequences(self, prompts: DataProto, blocking: Literal[False]) -> PendingGeneration: ...

    def generate_sequences(self, prompts: DataProto, blocking: bool = True) -> DataProto | PendingGeneration:
        """One response per row of ``prompts`` (left-padded prompt tensors and sampling ``meta_info``),
        in the layout of :mod:`verl.workers.rollout.base`; ``blocking=False`` returns at once."""
        ...

    def close(self) -> None:
        """Release what the client holds (threads, connections); the worker groups are not its."""
        ...


class WorkerGroupClient:
    """``rollout.mode=sync``: the rollout worker group generates the whole batch in one call."""

    def __init__(self, rollout_wg: Any) -> None:
        self.rollout_wg = rollout_wg

    def generate_sequences(self, prompts: DataProto, blocking: bool = True) -> Any:
        return self.rollout_wg.generate_sequences(prompts, blocking=blocking)

    def close(self) -> None:
        """Nothing to release: the trainer shuts the worker groups down."""
