# The image the K8s manifest's pods run (harness/launch/k8s.py DEFAULT_IMAGE):
#   docker build -f docker/npu.Dockerfile -t ascend-rl-harness:vllm-ascend-0.23.0 .
#   A3: --build-arg BASE=quay.io/ascend/vllm-ascend:v0.23.0-a3
# It starts from the stack's vllm-ascend image (vLLM and vllm-ascend built there from source) and runs the same
# scripts/install-npu-stack as the README and the nightly: the constraint set replaces that image's ray<=2.48
# (vllm-project/vllm-ascend v0.23.0 Dockerfile `ray>=2.47.1,<=2.48.0`, which ignores RAY_AUTH_MODE=token) with
# ray 2.60.0, then MindSpeed, mbridge and the harness.
ARG BASE=quay.io/ascend/vllm-ascend:v0.23.0
FROM ${BASE}
ARG STACK=vllm-ascend-0.23.0
COPY . /opt/ascend-rl-harness
WORKDIR /opt/ascend-rl-harness
RUN bash scripts/install-npu-stack "${STACK}" && python3 -m pip cache purge
