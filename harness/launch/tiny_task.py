"""The tiny verl run's reward, loaded by verl through `reward.custom_reward_function` (verl imports this module by
name; harness.config.cpu_tier.REWARD_FILE names it): the tiny task's math_dapo score (harness.config.task).
The harness is importable in every process of the job (its working directory is the repository, and verl imports
harness.launch.verl_cpu there first), but imported lazily so that loading the file costs nothing."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_kwargs):
    """math_dapo's score of "Answer: <response>" against the first digit of the prompt: +1 / -1, with `acc` (DAPO's
    filter metric); verl's DAPO reward manager adds the overlong penalty."""
    from harness.config.task import compute_score as task_score

    return task_score(data_source, solution_str, ground_truth, extra_info)
