# The two commands of the README. Each sets up its own environment (scripts/bootstrap, idempotent).
.PHONY: job test lint bootstrap rehearse
VENV ?= .venv

bootstrap:
	@HARNESS_VENV=$(VENV) scripts/bootstrap

# The main job: the tiny-scale suites against the real CPU stack, writing a benchmark report.
# (scripts/job and scripts/test exit with the harness's and pytest's own codes; make turns any failure into 2.)
job:
	@HARNESS_VENV=$(VENV) scripts/job

# The tests: harness self-tests plus every suite (scales and hardware not present skip with the reason).
test:
	@HARNESS_VENV=$(VENV) scripts/test

# Lint (run by .ci/run before the tests): ruff (pyflakes, pycodestyle, isort, bugbear) and the import layers.
lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# The NPU nightly's orchestration rehearsed on this CPU (no NPU kernels): the install set against verl's V1 imports,
# the NPU container without iproute2, the nightly's tiny-verl split and shared run root, a strict-hardware batch-
# invariance night, and on a multi-node Ray cluster of this host (harness.launch.cluster; root: unshare) jobs placed on
# a worker with the shared run root and verl's ray.init merge, each with its seeded revert. Not here: the aarch64
# resolution against the package index (`pytest tests -m registry`, network). The NPU platform itself, stubbed from
# its upstream source (issue 46): verl's Ascend platform under the sender's ranks and vllm-ascend's MoE layer under
# the adapter's sync and inside vLLM CPU's engine, each with its fix reverted (tests/test_npu_stubs.py: B1, B2, the
# wake-up re-transpose), and under --platform-stub one case each of the sender, MoE sync and sleep suites, green.
rehearse: bootstrap
	$(VENV)/bin/python -m pytest -p no:cacheprovider --strict-hardware tests/test_rehearsal.py tests/test_requirements.py \
	  tests/test_isolation.py tests/test_launch_local.py tests/test_ray_address.py tests/test_npu_stubs.py \
	  "tests/test_mla_seeded.py::test_no_claim_passes_under_strict_hardware" \
	  "tests/test_mla_seeded.py::test_the_no_claim_case_fails_the_night_with_its_fix_reverted"
	$(VENV)/bin/python -m pytest -p no:cacheprovider --strict-hardware --platform-stub npu \
	  suites/functional/test_megatron_sender_sync.py suites/functional/test_moe_weight_sync.py \
	  suites/memory/test_sleep_release.py \
	  -k "(reference and verl-tp1) or (reaches_moe and vllm and real and fp32) or (moe_experts_resume and vllm and level1)"

