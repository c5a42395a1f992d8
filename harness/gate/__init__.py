"""The upgrade gate: two stacks side by side on the CPU tier, and bisection that names the package that broke.

`ascend-rl-harness gate --from A --to B` builds each stack as an overlay over the installed one
(harness.gate.overlays), runs the same selection in each with `ascend-rl-harness run` (so each side gets run's whole
report set: report.json/.html/.md, junit.xml), compares the two reports and the verl config each side resolves
(harness.gate.verdict), and when B is worse bisects the moved packages with the cheapest failing test as the oracle.
The closest anchor is vllm-ascend's `tools/bisect` (PR #10564), which bisects one repository's commits; this gate
bisects across packages (verl x vLLM x transformers x Ray ...).
"""
