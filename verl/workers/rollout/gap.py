"""The rollout/trainer gap: how far the engine's log-probs of the sampled tokens are from the
trainer's, under verl's names (``training/rollout_probs_diff_{max,mean,std}`` on probabilities,
``training/rollout_logprob_diff_max`` on log-probs).

Kept as sums (tokens, sum, sum of squares, maxima) so that the update can gather it micro-batch by
micro-batch and rank by rank: the max of the maxima, the token-weighted mean, and the standard
deviation of all tokens pooled (unbiased, as ``torch.std``) equal those of the whole batch at once.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

import torch
import torch.distributed as dist


@dataclass
class GapSums:
    tokens: float = 0.0
    total: float = 0.0
    squares: float = 0.0
    peak: float = 0.0
    log_peak: float = 0.0

    @classmethod
    def of(cls, rollout_lp: torch.Tensor, trainer_lp: torch.Tensor, mask: torch.Tensor) -> GapSums:
        mask = mask.bool()
        if not mask.any():
            return cls()
        rollout, trainer = rollout_lp.detach()[mask].double(), trainer_lp.detach()[mask].double()
        diff = (rollout.exp() - trainer.exp()).abs()
        return cls(
            float(mask.sum()),
            float(diff.sum()),
            float(diff.square().sum()),
            float(diff.max()),
            float((rollout - trainer).abs().max()),
        )

    def __add__(self, other: GapSums) -> GapSums:
        return GapSums(
            self.tokens + other.tokens,
            self.total + other.total,
            self.squares + other.squares,
            max(self.peak, other.peak),
            max(self.log_peak, other.log_peak),
        )

    def over_ranks(self) -> GapSums:
        """Pooled over every rank of the default process group."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self
        sums = torch.tensor(astuple(self)[:3], dtype=torch.float64)
        peaks = torch.tensor(astuple(self)[3:], dtype=torch.float64)
        dist.all_reduce(sums)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        return GapSums(*sums.tolist(), *peaks.tolist())

    def metrics(self) -> dict[str, float]:
        if self.tokens == 0:
            return {}
        mean = self.total / self.tokens
        var = (self.squares - self.total * mean) / (self.tokens - 1) if self.tokens > 1 else 0.0
        return {
            "training/rollout_probs_diff_max": self.peak,
            "training/rollout_probs_diff_mean": mean,
            "training/rollout_probs_diff_std": max(var, 0.0) ** 0.5,
            "training/rollout_logprob_diff_max": self.log_peak,
        }
