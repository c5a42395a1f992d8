#!/usr/bin/env bash
# Test fixture (written for the harness, in the idiom of verl-recipe's dapo/ scripts): ray job submit of a recipe's
# main, lengths by arithmetic, variables defaulted from the environment, an `if` on the device, ${X:+...}.
project_name='DAPO'
exp_name='DAPO-DSV3-npu'
adv_estimator=grpo
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
overlong_buffer_len=$((1024 * 4))
enable_overlong_buffer=True
NNODES=${NNODES:-16}
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/DeepSeek-V3-Base"}
CKPTS_DIR=${CKPTS_DIR:-"${RAY_DATA_HOME}/ckpts/${project_name}/${exp_name}"}
DEVICE=${DEVICE:-npu}
if [ "$DEVICE" = "npu" ]; then
    export HCCL_CONNECT_TIMEOUT=1800
fi
EXTRA=${USE_EP:+actor_rollout_ref.rollout.expert_parallel_size=8}

ray job submit --no-wait --runtime-env="${RUNTIME_ENV:-verl/trainer/runtime_env.yaml}" \
    -- python3 -m recipe.dapo.main_dapo \
    --config-path=config --config-name='dapo_megatron_trainer' \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    algorithm.adv_estimator=${adv_estimator} \
    reward_model.overlong_buffer.enable=${enable_overlong_buffer} \
    reward_model.overlong_buffer.len=${overlong_buffer_len} \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    trainer.default_local_dir="${CKPTS_DIR}" \
    trainer.device=${DEVICE} \
    trainer.nnodes="${NNODES}" \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8 \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=32 \
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=32 \
    trainer.n_gpus_per_node=16 $EXTRA
