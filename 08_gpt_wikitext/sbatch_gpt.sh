#!/bin/bash
# sbatch_gpt.sh - chapter 08's GPT on a SLURM cluster: 2 nodes x 4 GPUs = 8
# ranks, one ddprun per node, so that a failed rank or a lost node restarts
# the job from its last snapshot (--max_restarts).
#
# Submit from the course's root or from 08_gpt_wikitext/, after building the
# course (make) on a shared filesystem or at the same path on every node,
# with WikiText-2 on every node (the same files: the ranks check it):
#     sbatch 08_gpt_wikitext/sbatch_gpt.sh      (or, in 08_gpt_wikitext/: sbatch sbatch_gpt.sh)
# Adapt the #SBATCH lines to your cluster (partition, account, GPU syntax).
#
#SBATCH --job-name=course-gpt
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one task per node: its ddprun, which starts a rank per GPU
#SBATCH --gpus-per-node=4            # older SLURM: --gres=gpu:4
#SBATCH --cpus-per-task=32           # the node's cores, for ddprun's 4 workers
#SBATCH --time=01:00:00
#SBATCH --output=course-gpt-%j.out
##SBATCH --partition=gpu             # (two #: commented out)
##SBATCH --account=myproject

set -euo pipefail
# sbatch runs a copy of this script in the folder it was submitted from.
if [[ -x 08_gpt_wikitext/08_gpt_wikitext ]]; then root=.; else root=..; fi
root=$(cd "$root" && pwd)

# Node 0 is the first node of the allocation: its launcher serves the store.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))   # one port per job
GPUS_PER_NODE=4
export MASTER_ADDR MASTER_PORT GPUS_PER_NODE

# What reaches every rank on every node (srun passes this environment on).
export WIKITEXT_DIR=${WIKITEXT_DIR:-$root/../shared/data/wikitext-2}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}    # INFO when something is wrong: on ALL nodes
# export NCCL_SOCKET_IFNAME=ib0          # the interface between the nodes (eth0, ens, ^docker,lo ...)
# export NCCL_IB_DISABLE=1               # no InfiniBand: TCP sockets between the nodes
# export COURSE_SOCKET_IFNAME=ib0        # the same choice for the course's cpu backend
# export COURSE_TIMEOUT=600              # seconds any rank or launcher waits for another

# The global batch is 2 nodes x 4 GPUs x --batch_size 8 = 64 sequences of
# 128 tokens. Rank 0 writes the snapshots on node 0, in this job's folder;
# a restart resumes from the newest, broadcast to every rank.
run=$root/runs/gpt-$SLURM_JOB_ID
echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes ($SLURM_JOB_NODELIST), rendezvous at $MASTER_ADDR:$MASTER_PORT; output in $run"

# SLURM_NODEID is read on each node, hence the single quotes.
srun --kill-on-bad-exit=1 bash -c '"$0"/tools/ddprun --nnodes=$SLURM_NNODES --node_rank=$SLURM_NODEID \
    --nproc_per_node=$GPUS_PER_NODE --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT --max_restarts=3 \
    "$0"/08_gpt_wikitext/08_gpt_wikitext --epochs 4 --batch_size 8 --save_every 1 \
    --out_dir "$1" --snapshot_path "$1"/snapshots/gpt.safetensors' "$root" "$run"

# Without ddprun (no restarts): one task per GPU started by srun itself, and
# rank 0 serving the store, as 07_multinode/sbatch_example.sh does (with
# #SBATCH --ntasks-per-node=4 there).
