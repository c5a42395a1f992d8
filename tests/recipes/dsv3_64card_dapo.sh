#!/usr/bin/env bash
# Test fixture: a team's own DAPO script for DeepSeek-V3 on 8 Atlas 800T A2 nodes (64 cards), written as a verl user
# would (verl recipe/dapo/run_dapo_qwen2.5_32b.sh's shape, DSV3's Megatron keys as verl's r1_ascend 671B recipe sets
# them): TP8 PP8 EP8, first/last stages of 7 and 6 layers, full block recompute of 8 layers, rollout TP8 DP8 EP64.
# The harness did not write its job: the reduced tier brings it up at 4 layers on one node (harness.config.job.reduce).
# Never run by the tests: only read.
set -euo pipefail

NNODES=${NNODES:-8}
MODEL_PATH=${MODEL_PATH:-/mnt/models/DeepSeek-V3}
TRAIN_FILE=/mnt/data/dapo-math-17k.parquet
TEST_FILE=/mnt/data/aime-2024.parquet
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
overlong_buffer_len=$((1024 * 4))

export HCCL_BUFFSIZE=400
export VLLM_USE_V1=1

python3 -m verl.trainer.main_ppo \
    --config-name=ppo_megatron_trainer \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=acc \
    data.train_files="${TRAIN_FILE}" \
    data.val_files="${TEST_FILE}" \
    data.prompt_key=prompt \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=256 \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8 \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=8 \
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 \
    actor_rollout_ref.actor.megatron.param_offload=True \
    actor_rollout_ref.actor.megatron.optimizer_offload=True \
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=7 \
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=6 \
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full \
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=block \
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=8 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=8 \
    actor_rollout_ref.rollout.data_parallel_size=8 \
    actor_rollout_ref.rollout.expert_parallel_size=64 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \
    actor_rollout_ref.rollout.max_num_batched_tokens=8192 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    reward.reward_manager.name=dapo \
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward.reward_kwargs.overlong_buffer_cfg.len=${overlong_buffer_len} \
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    +reward.reward_kwargs.max_resp_len=${max_response_length} \
    trainer.logger='["console","wandb"]' \
    trainer.project_name=dapo-dsv3 \
    trainer.experiment_name=dsv3-64card \
    trainer.device=npu \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes="${NNODES}" \
    trainer.total_training_steps=200 \
    trainer.save_freq=20 \
    trainer.test_freq=10
