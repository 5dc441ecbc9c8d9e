"""Partial rollout at a fixed token: a batch generated across a weight sync, in two calls.

verl's partial rollout interrupts the requests in flight at a weight sync and continues them with
the new weights, so a response's tokens carry two versions. Where the interruption falls then depends
on how far the rollout had got when the sync came: on a task whose rollout outpaces the trainer it
never falls inside a response. With ``async_training.partial_rollout_interrupt_at=t`` (batched
rollout, ``rollout.mode=sync``) the driver makes it structural: a batch that the schedule trains
after the next sync is generated up to response token ``t`` with the version published at its
submission (:func:`prefix_prompts`), and, once the next version is published, continued from there
with it (:func:`continuation_prompts`); :func:`stitch` joins the two. Each part's tokens, versions and
``rollout_log_probs`` come from the weights that drew them (the continuation is scored given its
prefix), and both calls are seeded, so a seeded run gives the same samples whatever the timing.
"""

from __future__ import annotations

import torch

from verl.protocol import DataProto
from verl.utils.metric import reduce_metrics
from verl.workers.rollout.base import response_tensors

CONTINUATION_SEED = 1 << 20
"""Added to a generation's sampling seed for its continuation (apart from every generation's own)."""
REBUILT = {
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "response_versions",
    "policy_version",
}
"""Keys :func:`stitch` rebuilds from the joined responses; other per-token keys are joined."""


def prefix_prompts(prompts: DataProto, interrupt_at: int) -> DataProto:
    """``prompts`` asking for the first ``interrupt_at`` response tokens only (in place)."""
    prompts.meta_info["response_length"] = interrupt_at
    return prompts


def continuation_prompts(
    prompts: DataProto, prefix: DataProto, response_length: int, version: int
) -> DataProto:
    """The prompts that continue ``prefix`` (the output of ``prompts``) to ``response_length`` tokens in
    all, with weight ``version``: each prompt followed by its whole prefix. A row that ended inside
    the prefix goes on too (its mask stops at its EOS when stitched), so every row keeps its place."""
    t = prefix.batch["responses"].shape[1]
    prompt_mask = prefix.batch["attention_mask"][:, :-t]
    tensors = {
        "input_ids": prefix.batch["input_ids"],
        "attention_mask": torch.cat([prompt_mask, prompt_mask.new_ones(len(prefix), t)], dim=1),
        "position_ids": prefix.batch["position_ids"],
    }
    meta = dict(prompts.meta_info, response_length=response_length - t, weight_version=version)
    meta["sampling_seed"] = prompts.meta_info["sampling_seed"] + CONTINUATION_SEED
    return DataProto.from_dict(tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info=meta)


def stitch(prefix: DataProto, rest: DataProto, eos_token_ids: list[int]) -> DataProto:
    """One output in the rollout layout (:mod:`verl.workers.rollout.base`) from a prefix and its
    continuation: responses joined, each token with the version that drew it, the response mask up
    to the first EOS of the joined response (``eos_token_ids=[-1]``: none)."""
    p, r = prefix.batch, rest.batch
    t = p["responses"].shape[1]
    if len(prefix) != len(rest) or not torch.equal(r["prompts"][:, -t:], p["responses"]):
        raise RuntimeError("a continuation does not continue its prefix row for row (partial rollout)")
    responses = torch.cat([p["responses"], r["responses"]], dim=1)
    versions = torch.cat(
        [p["policy_version"][:, None].expand(-1, t), r["policy_version"][:, None].expand_as(r["responses"])],
        dim=1,
    )
    prompt_len = p["prompts"].shape[1]
    tensors = response_tensors(
        p["prompts"],
        p["attention_mask"][:, :prompt_len],
        p["position_ids"][..., :prompt_len],  # [B, P] or [B, 3, P]
        responses,
        versions,
        eos_token_ids,
    )
    for key in set(p.keys()) - REBUILT:
        if key not in r.keys() or p[key].shape[1:2] != (t,):
            raise RuntimeError(f"partial rollout cannot join the rollout's per-row key {key!r}")
        tensors[key] = torch.cat([p[key], r[key]], dim=1)
    # each part's metrics may hold one value per rank (a worker group's): one number each first
    metrics = reduce_metrics(dict(prefix.meta_info.get("metrics", {})))
    for key, value in reduce_metrics(dict(rest.meta_info.get("metrics", {}))).items():
        metrics[key] = max(metrics.get(key, value), value)
    return DataProto.from_dict(tensors, meta_info={"metrics": metrics})
