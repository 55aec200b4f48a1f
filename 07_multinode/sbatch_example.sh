#!/bin/bash
# sbatch_example.sh - chapter 07 on a SLURM cluster: 2 nodes x 4 GPUs = 8 ranks.
#
# Submit from the course's root or from 07_multinode/, after building the
# course on a shared filesystem (or at the same path on every node):
#     sbatch 07_multinode/sbatch_example.sh      (or, in 07_multinode/: sbatch sbatch_example.sh)
# Adapt the #SBATCH lines to your cluster (partition, account, GPU syntax).
#
#SBATCH --job-name=course-07
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4          # one task = one rank = one GPU
#SBATCH --gpus-per-node=4            # older SLURM: --gres=gpu:4
# Every task sees the node's 4 GPUs and takes GPU LOCAL_RANK (= SLURM_LOCALID).
# Not --gpus-per-task=1: each task would then see a single GPU, and the
# course's one-GPU-per-rank check (common/pg.h) would take 4 ranks for 4
# ranks sharing one GPU and choose the cpu backend.
#SBATCH --cpus-per-task=8
#SBATCH --time=00:30:00
#SBATCH --output=course-07-%j.out
##SBATCH --partition=gpu             # (two #: commented out)
##SBATCH --account=myproject

set -euo pipefail
# sbatch runs a copy of this script in the folder it was submitted from.
if [[ -x 07_multinode/07_multinode ]]; then root=.; else root=..; fi

# Rank 0 runs on the first node of the allocation, so its host name is
# MASTER_ADDR; srun gives SLURM_PROCID 0 to the first task of that node.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# One port per job, so that two jobs sharing a node do not collide.
MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
export MASTER_ADDR MASTER_PORT

# NCCL between nodes (see the table in TROUBLESHOOTING.md). These reach every rank:
# srun passes the environment of this script to all tasks on all nodes.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}    # INFO when something is wrong: on ALL nodes
# export NCCL_SOCKET_IFNAME=ib0          # the interface between the nodes (eth0, ens, ^docker,lo ...)
# export NCCL_IB_DISABLE=1               # no InfiniBand: TCP sockets between the nodes
# export COURSE_SOCKET_IFNAME=ib0        # the same choice for the course's cpu backend

echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes ($SLURM_JOB_NODELIST), rendezvous at $MASTER_ADDR:$MASTER_PORT"

# srun starts 4 tasks on each node and sets, for each, SLURM_PROCID (the
# global rank), SLURM_NTASKS (the world size), SLURM_LOCALID (the local rank)
# and SLURM_NODEID; common/launch_env.h reads them. No launcher serves the
# store here, so rank 0 serves it at MASTER_ADDR:MASTER_PORT (env://).
# --kill-on-bad-exit: one failed rank ends the step instead of leaving the
# others waiting for it until their timeout.
srun --kill-on-bad-exit=1 "$root/07_multinode/07_multinode" --total_epochs 20 --save_every 2

# With automatic restarts instead: one ddprun per node, which starts that
# node's workers and restarts them all after a failure (the variables are
# read on each node, hence the single quotes):
#   srun --ntasks-per-node=1 bash -c "$root"'/tools/ddprun --nnodes=$SLURM_NNODES \
#       --node_rank=$SLURM_NODEID --nproc_per_node=4 --master_addr=$MASTER_ADDR \
#       --master_port=$MASTER_PORT --max_restarts=3 '"$root"'/07_multinode/07_multinode --total_epochs 20'
