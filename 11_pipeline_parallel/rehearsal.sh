#!/usr/bin/env bash
# rehearsal.sh - the course's finale on one machine: the GPT trained by a
# 3D mesh, dp x tp x pp = 2 x 2 x 2, on two "hosts", one of which dies
# mid-run and comes back.
#
# Chapter 08's rehearsal (../08_gpt_wikitext/rehearsal.sh: two network
# namespaces as root, else two launchers on 127.0.0.1) with this chapter's
# program on 4 + 4 workers: --pp 2 --tp 2, so that the mesh pp x dp x tp
# puts stage 0 on host 0 (ranks 0-3) and stage 1 on host 1 (ranks 4-7).
# Between the hosts travel only the activations and their gradients (and
# the tied embedding's all-reduce); the tp all-reduces of every block and
# the dp all-reduce of each step stay inside a host. Each step's batch is
# 2 replicas x 2 micro-batches x 2 sequences. The reference is chapter 08
# in one process with batch 4 and --grad_accum 2: the same step.
#
# Host 1 is killed (kill -9) once rank 0 has saved the first snapshot; a
# second later its launcher starts again, and the whole job resumes from
# the snapshot on host 0's disk. The rehearsal passes when every
# validation loss equals the reference's within 2e-4 and the final l2
# norms within 1e-5.
#
# Usage: 11_pipeline_parallel/rehearsal.sh [OPTIONS]: those of
# ../08_gpt_wikitext/rehearsal.sh (--mode, --epochs, --no_kill, --out, ...).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$HERE/../08_gpt_wikitext/rehearsal.sh" --program "$HERE/11_pipeline_parallel" --nproc0 4 --nproc1 4 \
    --replicas 2 --worker_args "--pp 2 --tp 2 --grad_accum 2" --reference_args "--grad_accum 2" --epochs 2 "$@"
