#!/usr/bin/env bash
# Test fixture (written for the harness, in the idiom of cann-recipes-train's llm_rl scripts): exported environment,
# a variable only the caller sets ($DATA_DIR), a command substitution, `export` of an earlier assignment.
export HCCL_BUFFSIZE=300                 # the buffer size of HCCL
export TASK_QUEUE_ENABLE=2
CURRENT_IP=$(hostname -I | awk '{print $1}')
WORLD=$((16 * 16))
export WORLD
python3 -m verl.trainer.main_ppo \
    data.train_files=$DATA_DIR/train.parquet \
    trainer.project_name=cann_${CURRENT_IP} \
    trainer.n_gpus_per_node=16 \
    trainer.nnodes=$((WORLD / 16))
