"""The critic's clipped value loss (PPO)."""

from __future__ import annotations

import torch

from verl.algorithms.loss_agg import agg_loss
from verl.utils.torch_functional import clip_by_value, masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss of PPO (as in TRL and verl).

    ``v_clip = clip(vpreds, values - c, values + c)``;
    ``vf_loss = 0.5 * agg(max((vpreds - R)^2, (v_clip - R)^2))``;
    ``vf_clipfrac`` = fraction of valid tokens where the clipped term is larger. The last four
    arguments are ``agg_loss``'s global-batch normalisation.

    Returns:
        ``(vf_loss, vf_clipfrac)``, both scalar tensors.
    """
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        torch.max(vf_losses1, vf_losses2),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac
