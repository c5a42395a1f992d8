"""msprobe dumps of the reference and of the MindSpeed wrong-scale engine, `msprobe compare` on the step
directories, and the harness names the first op that is not `pass`: it must be the softmax-scale multiply in
the attention (seed 001 精度问题2 was found by this kind of op-by-op dump comparison)."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.markers import requires, skip_or_fail
from harness.mla import localize


@pytest.mark.tiny
@pytest.mark.cpu
@requires(packages=["msprobe"])
def test_msprobe_names_first_divergent_op(tmp_path, record_property, pytestconfig):
    if localize.msprobe_command() is None:
        skip_or_fail(pytestconfig, "the `msprobe` command (beside this Python or on PATH; pip install "
                                   "mindstudio-probe)")
    with ThreadPoolExecutor(2) as pool:  # two child processes, one per core
        golden, target = pool.map(lambda a: localize.dump_step(tmp_path / a[0], fault=a[1]),
                                  [("golden", None), ("target", "scale_v_head")])
    verdict = localize.first_not_pass(localize.compare_steps(target, golden, tmp_path / "compare"))
    assert verdict is not None, "msprobe found no difference between the right and the wrong softmax scale"
    # labelled as what they are: a passing test showed `result: error` (msprobe's verdict on the seeded op)
    record_property("mla.msprobe", {"seeded_fault": "scale_v_head", "first_divergent_op": verdict.name,
                                    "msprobe_result_of_that_op": verdict.result, "max_diff": verdict.max_diff,
                                    "where": verdict.stack})
    # The first divergence is the scale multiply of the first attention prefill, nothing upstream of it.
    assert verdict.name.startswith("Tensor.__mul__") and "_attn_prefill" in verdict.stack, verdict.describe()
