"""A custom reward function that scores every response 0 (no group is informative)."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
