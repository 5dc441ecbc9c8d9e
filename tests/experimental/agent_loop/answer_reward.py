"""Reward of the agent-loop training test: 1 when the response text contains the ground truth."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if str(ground_truth) in solution_str else 0.0
