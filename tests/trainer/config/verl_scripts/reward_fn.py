"""A custom reward function in verl's signature, for the verl-style scripts next to this file."""

from verl.utils.reward_score import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
