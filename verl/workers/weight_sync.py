"""``WeightSync``: the policy's weights on their way from the actor to the rollout.

The :class:`~verl.workers.actor_rollout_ref.ActorRolloutRefWorker` builds one in ``init_model``
and delegates its weight paths to it:

* **colocated** (the hybrid engine): the actor's weights go to the rollout in process
  (:meth:`WeightSync.push`), then a probe checks that the engine runs them
  (:meth:`WeightSync.prepare_check`, :meth:`WeightSync.verify`);
* **split pools** (asynchronous training): the actor's ranks publish the weights by a transport
  (:meth:`WeightSync.publish`), the rollout's ranks receive them (:meth:`WeightSync.receive`).

The transports themselves live in :mod:`verl.workers.weight_transport`; the version counter is the
driver's, and the worker records the version it holds.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.config.actor import ActorRolloutRefConfig
from verl.workers.engine.base import TrainEngine
from verl.workers.forward import response_log_probs, whole_sequence_batch
from verl.workers.rollout import Rollout, engine_dtype, syncs_lora_adapter, verify_weight_sync
from verl.workers.rollout.probe import Fingerprint, FingerprintSpec, fingerprinted
from verl.workers.rollout.staged import StagedWeights
from verl.workers.weight_transport import IN_PROCESS, Parcel, transport_of, weight_transport

# bf16 on one side or both: SmolLM2-135M's log-probs of real text part by 0.04-0.07 on average between
# fp32, autocast and pure-bf16 forwards; weights the sync failed to deliver part by whole nats
LOW_PRECISION_PROBE_TOL = 0.15
PROBE_TEXT = (  # what the weight-sync probe scores before the first update
    "Question: Tom has 12 apples and buys 7 more. How many apples does he have now? "
    "Answer: 12 + 7 = 19. He has 19 apples."
)


@dataclass
class SyncCheck:
    """What verifies one colocated sync: the probe, the actor's log-probs of it (taken before the
    push), and the fingerprint of the tensors sent (None where the engine serves LoRA adapters)."""

    probe: list[int]
    expected: torch.Tensor
    sent: tuple[FingerprintSpec, Fingerprint] | None


@dataclass(eq=False)
class WeightSync:
    """The worker's weight paths, over the parts the worker built."""

    config: ActorRolloutRefConfig
    device: torch.device
    tokenizer: Any
    actor: TrainEngine | None
    """None on a rollout-only rank."""
    param_count: int = 0
    """The actor's, which sizes the fingerprint's read-back."""
    target: Rollout | None = None
    """What the weights load into: the server (between two of its steps) in server mode, else the
    rollout; None on an actor-only rank."""
    staged: StagedWeights | None = None
    """The versions kept until a batch asks for them (a rollout rank)."""
    proximal_weights: list[torch.Tensor] | None = field(default=None, init=False)
    """This rank's actor parameters as :meth:`keep_proximal` kept them."""

    # ------------------------------------------------------------------ colocated sync + probe
    def prepare_check(self, version: int, last_sequence: list[int] | None) -> SyncCheck | None:
        """What :meth:`verify` needs, taken before the push (``rollout.weight_sync_check``; None when
        off): the probe (``last_sequence``, the first sequence of the last update, if any) and the
        actor's log-probs of it, and an empty fingerprint the push fills."""
        cfg = self.config.rollout
        probe = self._probe_ids(last_sequence)
        if not cfg.weight_sync_check:
            return None
        expected = self._actor_sequence_log_probs(probe)
        sent = None
        if not syncs_lora_adapter(cfg, self.config.model):
            sent = (self._fingerprint_spec(version), Fingerprint())
        return SyncCheck(probe, expected, sent)

    def push(self, version: int, check: SyncCheck | None) -> dict[str, float]:
        """Load the actor's weights into the colocated rollout as ``version`` (fingerprinted on the
        way where ``check`` asks for it)."""
        weights = self._rollout_weights()
        if check is not None and check.sent is not None:
            weights = fingerprinted(weights, *check.sent, skip=self._buffer_names())
        parcel = IN_PROCESS.send(weights, version)
        self.target.update_weights(IN_PROCESS.receive(parcel), version)
        return {"rollout/weight_sync_mb": parcel.megabytes}

    def verify(self, version: int, check: SyncCheck | None) -> dict[str, float]:
        """Check that the engine runs the weights just pushed: the weights read back from it must hash
        as the ones sent, and the probe's log-probs stay close (:func:`verify_weight_sync`)."""
        if check is None:
            return {}
        cfg = self.config.rollout
        tol = cfg.weight_sync_check_tol or (1e-3 if self._probe_in_fp32() else LOW_PRECISION_PROBE_TOL)
        gap = verify_weight_sync(self.target, check.probe, check.expected, tol, version, check.sent)
        return {"rollout/weight_sync_probe_gap": gap}

    def _fingerprint_spec(self, version: int) -> FingerprintSpec:
        """What the sync check hashes: the weights in the engine's dtype, columns sampled anew per
        version within a read-back budget (:mod:`verl.workers.rollout.probe`)."""
        dtype = engine_dtype(self.config.rollout, self.device.type)
        return FingerprintSpec.for_model(dtype, self.param_count, version)

    def _buffer_names(self) -> frozenset[str]:
        """Persistent buffers the actor sends (e.g. rotary tables): engines hold no parameter for them."""
        return frozenset(name for name, _ in self.actor.module.named_buffers())

    def _rollout_weights(self):
        """What the rollout loads: the actor's full weights (LoRA adapters merged in), or the
        adapters alone where the engine serves them (:func:`syncs_lora_adapter`)."""
        if syncs_lora_adapter(self.config.rollout, self.config.model):
            return self.actor.adapter_tensors()
        return self.actor.full_state_dict()

    def _probe_in_fp32(self) -> bool:
        """Whether both sides of the weight-sync probe compute in fp32 (its tight tolerance)."""
        rollout_fp32 = engine_dtype(self.config.rollout, self.device.type) == "float32"
        return rollout_fp32 and self.actor.compute_dtype == torch.float32

    def _probe_ids(self, last_sequence: list[int] | None) -> list[int]:
        """The probe of the weight-sync check: the first sequence of the last update, else
        :data:`PROBE_TEXT`, else (a tokenizer that makes less than two tokens of it) a fixed
        pseudo-random sequence. Real text keeps bf16 rounding small: on random tokens a 135M model's
        bf16 log-probs part from another bf16 engine's by more than on text."""
        cfg = self.config.rollout
        longest = min(64, (cfg.max_model_len or cfg.prompt_length + cfg.response_length) - 1)
        if last_sequence:
            return last_sequence[:longest]
        text = self.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"][:longest]
        if len(text) >= 2:
            return text
        vocab = self.actor.hf_config.vocab_size
        return torch.randint(0, vocab, (longest,), generator=torch.Generator().manual_seed(0)).tolist()

    def _actor_sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        micro = whole_sequence_batch(token_ids)
        return self.actor.infer([micro], lambda m, b: response_log_probs(m, b, 1.0))[0]["log_probs"][0]

    # ------------------------------------------------------------------ publishing and receiving (async)
    def keep_proximal(self) -> None:
        """Keep a copy of this rank's actor parameters as they are now (in host memory under
        ``param_offload``): what :meth:`publish` with ``proximal`` and the proximal log-probs use."""
        self.proximal_weights = self.actor.weights_copy()

    def publish(
        self, version: int, transport: str, weight_dir: str | None, proximal: bool, rank: int
    ) -> Parcel | None:
        """The actor's weights for the rollout as ``version`` (the kept proximal ones with
        ``proximal``), sent by ``transport``: every rank takes part in the gather, rank 0 returns the
        parcel, the others None."""
        with self.actor.computing_with(self.proximal_weights) if proximal else nullcontext():
            weights = self._rollout_weights()
            if rank != 0:
                for _ in weights:  # the gather is collective
                    pass
                return None
            return weight_transport(transport, weight_dir).send(weights, version)

    def receive(self, parcel: Parcel, keep_from: int | None) -> None:
        """Load published weights as a whole (``keep_from`` None), or stage them by version until a
        batch asks for them (versions older than ``keep_from`` go)."""
        weights = transport_of(parcel).receive(parcel)
        if keep_from is None:
            self.target.update_weights(weights, parcel.version)
        else:
            self.staged.add(dict(weights), parcel.version, keep_from)
