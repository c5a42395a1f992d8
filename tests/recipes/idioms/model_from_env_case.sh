#!/usr/bin/env bash
# Test fixture (written for the harness, in the idiom of verl's examples/grpo_trainer/
# run_kimi_k2_6_glm5_1_megatron_lite.sh): the model is picked by a `case` whose default branch exits, and its path
# comes only from the environment the script is started with (`MODEL_PATH=... bash this.sh`).
set -euo pipefail
MODEL_VARIANT=${MODEL_VARIANT:-moonlight}
case "${MODEL_VARIANT}" in
    moonlight)
        MODEL_PATH=${MODEL_PATH:-${MOONLIGHT_MODEL_PATH:-}}
        TP=4 ;;
    dsv3|r1)
        MODEL_PATH=${MODEL_PATH:-${DSV3_MODEL_PATH:-}}
        TP=8 ;;
    *)
        echo "Unsupported MODEL_VARIANT=${MODEL_VARIANT}" >&2
        exit 1 ;;
esac
: "${MODEL_PATH:?set MODEL_PATH for MODEL_VARIANT=${MODEL_VARIANT}}"
[[ -n "${NNODES:-}" ]] || NNODES=3
python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=${TP} \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3 \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    trainer.device=npu trainer.n_gpus_per_node=8 trainer.nnodes=${NNODES} "$@"
