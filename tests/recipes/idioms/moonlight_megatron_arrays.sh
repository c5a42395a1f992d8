#!/usr/bin/env bash
# Test fixture (written for the harness, in the idiom of verl's examples/grpo_trainer Megatron scripts): overrides
# gathered in arrays and passed as "${ARR[@]}", nested and positional defaults, a helper function.
set -xeuo pipefail

NODES=${NODES:-3}
GPUS=${1:-8}
HF_MODEL_PATH=${HF_MODEL_PATH:-"${HOME}/models/Moonlight-16B-A3B"}
train_tp=4
train_pp=3
train_ep=4

log_name() { echo "moonlight_${1}_$(date +%s)"; }

MODEL=(
    actor_rollout_ref.model.path="$HF_MODEL_PATH"
    +actor_rollout_ref.model.override_config.model_config.max_position_embeddings=32768
)
ACTOR=(
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$train_tp
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$train_pp
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=$train_ep
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1
    # a comment between the array's items
    actor_rollout_ref.actor.ppo_mini_batch_size=$((64 * 2))
)
ROLLOUT=(actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.rollout.n=5)
ROLLOUT+=(actor_rollout_ref.rollout.name=vllm)

python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=grpo \
    "${MODEL[@]}" \
    "${ACTOR[@]}" \
    "${ROLLOUT[@]}" \
    trainer.experiment_name="$(log_name gsm8k)" \
    trainer.nnodes=$NODES \
    trainer.n_gpus_per_node=$GPUS \
    trainer.total_epochs=15 "$@"
