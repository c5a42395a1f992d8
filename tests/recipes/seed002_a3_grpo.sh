#!/usr/bin/env bash
# Test fixture written from seed 002 (CANN's DeepSeek-R1 RL recipe on Atlas A3, 128 cards = 256 dies): the A3 job's
# environment and its verl command, as cann-recipes-train's llm_rl/deepseek/verl_patches/scripts launch it
# (train_deepseekv3_256die_true_weight.sh exports the environment, then runs
# internal/train_grpo_deepseekv3_256die_true_weight.sh). Seed 002's plan: TP4 PP8 EP8, stages 7,7,8,8,8,8,8,7
# (convert_ckpt_deepseek3.py --num-layer-list), GBS 512 x n 16, 1K prompt / 3K response, recompute 8 layers
# ("重计算改为8层"), 120 TPS/card with graph mode. Keys verl 0.9.1 no longer has (pipeline_parallel_num_layer_list,
# gradient_checkpointing_kwargs, swap_optimizer, load_weight) are the fork's, kept as a user upgrading would have them.
# Never run by the tests: `plan`/`memory`/`doctor`/`launch --recipe` only read it.

source /usr/local/Ascend/ascend-toolkit/set_env.sh
ray stop --force

NNODES=16
NPUS_PER_NODE=16
MASTER_ADDR="IP FOR MASTER NODE"
SOCKET_IFNAME="SOCKET IFNAME FOR CURRENT NODE"
CURRENT_IP=$(ifconfig $SOCKET_IFNAME | grep -Eo 'inet (addr:)?([0-9]{1,3}\.){3}[0-9]{1,3}' | awk '{print $NF}')

export RAY_DEDUP_LOGS=0
export HYDRA_FULL_ERROR=1
export DIST_CKPT_PATH=/data/dsv3/sharded_tp4_pp8_ep8
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_NPU_ALLOC_CONF="expandable_segments:True"
export WORLD_SIZE=$(($NNODES*$NPUS_PER_NODE))
export HCCL_SOCKET_IFNAME=$SOCKET_IFNAME
export HCCL_CONNECT_TIMEOUT=600
export HCCL_EXEC_TIMEOUT=600
export VLLM_USE_V1=1
export VLLM_ENABLE_GRAPH_MODE=1
export VLLM_DP_SIZE=64
export TASK_QUEUE_ENABLE=2
export HCCL_BUFFSIZE=300

TP=4
PP=8
EP=8
MAX_PROMPT=1024
MAX_RESPONSE=$((1024 * 3))

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=./data/deepscaler/train.parquet \
    data.val_files=./data/deepscaler/test.parquet \
    data.train_batch_size=512 \
    data.max_prompt_length=${MAX_PROMPT} \
    data.max_response_length=${MAX_RESPONSE} \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=./DeepSeek-V3 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.clip_grad=1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=512 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$PP \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=$EP \
    actor_rollout_ref.actor.megatron.pipeline_parallel_num_layer_list=[7,7,8,8,8,8,8,7] \
    actor_rollout_ref.actor.megatron.sequence_parallel=True \
    actor_rollout_ref.actor.megatron.swap_optimizer=True \
    actor_rollout_ref.actor.megatron.optimizer_offload=False \
    actor_rollout_ref.actor.megatron.use_dist_checkpointing=True \
    actor_rollout_ref.actor.megatron.dist_checkpointing_path=$DIST_CKPT_PATH \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.model.gradient_checkpointing_kwargs.activations_checkpoint_granularity=full \
    actor_rollout_ref.model.gradient_checkpointing_kwargs.activations_checkpoint_method=block \
    actor_rollout_ref.model.gradient_checkpointing_kwargs.activations_checkpoint_num_layers=8 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \
    actor_rollout_ref.rollout.enforce_eager=False \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.temperature=0.9 \
    actor_rollout_ref.rollout.top_k=50 \
    actor_rollout_ref.rollout.top_p=0.9 \
    actor_rollout_ref.rollout.max_num_batched_tokens=1024 \
    actor_rollout_ref.rollout.enable_chunked_prefill=True \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.device=npu \
    trainer.val_before_train=False \
    trainer.logger=['console','tensorboard'] \
    trainer.project_name='verl_grpo_dsv3_a3' \
    trainer.experiment_name='dsv3_671b_256die' \
    trainer.n_gpus_per_node=$NPUS_PER_NODE \
    trainer.nnodes=$NNODES \
    trainer.save_freq=-1 \
    trainer.test_freq=-1 \
    trainer.total_epochs=1 $@ 2>&1 | tee logs/train.log
