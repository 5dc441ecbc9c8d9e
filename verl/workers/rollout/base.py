"""``Rollout``: the narrow interface of every generation backend.

``generate_sequences(prompts) -> DataProto`` takes left-padded prompts (``input_ids``,
``attention_mask``, ``position_ids``; ``meta_info`` may carry ``do_sample``,
``validate``, ``temperature``, ``top_p``, ``top_k``, ``response_length``) and returns:

* ``prompts`` [B, P], ``responses`` [B, R] (right-padded), ``input_ids`` [B, P+R],
  ``attention_mask`` [B, P+R], ``position_ids`` [B, P+R], ``response_mask`` [B, R];
* ``rollout_log_probs`` [B, R]: log-probs of the sampled tokens under the weights that
  produced them (training generations only);
* ``response_versions`` [B, R] and ``policy_version`` [B]: the weight version behind each
  token (they differ inside a sequence when an update landed mid-generation).

``update_weights(named_tensors, version)`` installs new weights atomically (a generation
never runs on a half-updated model); ``sleep()`` / ``wake_up()`` free and restore device
memory between generations; ``sequence_log_probs(token_ids)`` scores a fixed sequence under
the engine's current weights and ``weight_fingerprint(spec)`` hashes the weights the engine computes
with (the probes that verify a weight sync, see :func:`verify_weight_sync`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch

from verl.config.rollout import ROLLOUT_DTYPES, RolloutConfig
from verl.protocol import DataProto
from verl.utils.torch_functional import get_response_mask
from verl.workers.rollout.probe import Fingerprint, FingerprintSpec, stale_groups


def engine_dtype(config: RolloutConfig, device_type: str) -> str:
    """The torch name of the dtype the rollout engine holds and runs the weights in: ``rollout.dtype``
    on GPU, and on CPU with ``rollout.use_dtype_on_cpu``; else float32."""
    return ROLLOUT_DTYPES[config.dtype] if device_type == "cuda" or config.use_dtype_on_cpu else "float32"


class Rollout(ABC):
    version: int = 0

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of ``prompts``."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the weights with ``named_tensors`` and record ``version``."""

    def sleep(self) -> None:
        """Release device memory (no-op where there is nothing to release)."""

    def wake_up(self) -> None:
        """Reacquire device memory before generating."""

    @abstractmethod
    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        """Log-probs at temperature 1 of ``token_ids[1:]``, each given the tokens before it."""

    def weight_fingerprint(self, spec: FingerprintSpec) -> dict[str, int | None] | None:
        """The :mod:`~verl.workers.rollout.probe` fingerprint of the weights the engine computes with;
        None where the backend cannot read them back (then only the log-prob probe checks a sync)."""
        return None

    def state_dict(self) -> dict:
        """State that determines future generations (the sampling RNG), for exact resume."""
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]


def response_tensors(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_pos: torch.Tensor,
    responses: torch.Tensor,
    token_versions: torch.Tensor,
    eos_token_ids: list[int],
) -> dict[str, torch.Tensor]:
    """The layout every backend returns (see the module doc string), from left-padded prompts and
    right-padded ``responses`` with the weight version of each generated token. The response mask
    covers each row up to and including its first EOS (none: ``eos_token_ids=[-1]``)."""
    response_mask = get_response_mask(responses, eos_token_ids, dtype=prompt_mask.dtype)
    steps = torch.arange(1, responses.shape[1] + 1, device=responses.device)
    return {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "position_ids": torch.cat([prompt_pos, prompt_pos[..., -1:] + steps], dim=-1),  # [B, L] or [B, 3, L]
        "response_mask": response_mask,
        "response_versions": torch.where(response_mask.bool(), token_versions, -1),
        "policy_version": token_versions[:, 0],
    }


def assemble_responses(
    prompts: DataProto,
    outputs: list[tuple[list[int], list[float]]],
    response_length: int,
    pad_token_id: int,
    eos_token_ids: list[int],
    version: int,
    with_log_probs: bool,
) -> DataProto:
    """The rollout layout from an engine's per-row ``(token ids, log-probs)`` of one call with one
    weight ``version``: responses cut to ``response_length`` and right-padded, ``rollout_log_probs``
    (with ``with_log_probs``) zero past each response's end."""
    p = prompts.batch
    responses = torch.full((len(outputs), response_length), pad_token_id, dtype=p["input_ids"].dtype)
    log_probs = torch.zeros(len(outputs), response_length)
    for i, (tokens, lps) in enumerate(outputs):
        tokens, lps = tokens[:response_length], lps[:response_length]
        responses[i, : len(tokens)] = torch.tensor(tokens, dtype=responses.dtype)
        if with_log_probs:
            log_probs[i, : len(lps)] = torch.tensor(lps)
    versions = torch.full(responses.shape, version, dtype=torch.long)
    tensors = response_tensors(
        p["input_ids"], p["attention_mask"], p["position_ids"], responses, versions, eos_token_ids
    )
    if with_log_probs:
        tensors["rollout_log_probs"] = log_probs * tensors["response_mask"]
    return DataProto.from_dict(tensors, meta_info={"metrics": {}})


class WeightSyncError(RuntimeError):
    """The rollout engine does not run the weights the trainer just sent."""


def verify_weight_sync(
    rollout: Rollout,
    token_ids: list[int],
    expected: torch.Tensor,
    tolerance: float,
    version: int,
    sent: tuple[FingerprintSpec, Fingerprint] | None = None,
) -> float:
    """Check that the engine runs the weights just sent as ``version``; raise
    :class:`WeightSyncError` if not, else return the probe's mean absolute log-prob gap.

    * ``sent`` (the spec and fingerprint of the tensors sent, in the engine's dtype): the engine's
      fingerprint read back after the load must equal it exactly, group by group (decoder layer,
      embeddings, LM head, ...). This sees one missed update at any learning rate and in any
      precision, and a sync that left a single layer, or only a packed LM head, stale.
    * the engine's log-probs of the probe ``token_ids`` against the trainer's ``expected``: the mean
      absolute gap must stay within ``tolerance``. This sees an engine that holds the right weights
      but computes something else, and covers backends that cannot read weights back."""
    if sent is not None:
        spec, fingerprint = sent
        engine = rollout.weight_fingerprint(spec)
        stale, compared = stale_groups(fingerprint, engine or {})
        if stale:
            raise WeightSyncError(
                f"weight sync to version {version} failed verification: read back after the load, the "
                f"rollout engine's weights of {len(stale)} of {compared} parts ({', '.join(stale[:5])}"
                f"{', ...' if len(stale) > 5 else ''}) differ from the ones the trainer sent (compared "
                f"exactly, in {spec.dtype}); the engine is not running the trained weights. Set "
                "actor_rollout_ref.rollout.weight_sync_check=False only to debug this"
            )
    got = rollout.sequence_log_probs(token_ids).float()
    gap = float((got - expected.float().cpu()).abs().mean())
    if not gap <= tolerance:
        raise WeightSyncError(
            f"weight sync to version {version} failed verification: on a {len(token_ids)}-token probe the "
            f"rollout engine's log-probs differ from the trainer's by {gap:.3g} on average (tolerance "
            f"{tolerance:g}, actor_rollout_ref.rollout.weight_sync_check_tol); the engine is not running "
            "the trained weights. Set actor_rollout_ref.rollout.weight_sync_check=False only to debug this"
        )
    return gap
