#!/usr/bin/env bash
# rehearsal.sh - the finale on two "hosts", one of which dies mid-run and
# comes back: pp 2 x ep 2 x cp 2 x tp 2 = 16 ranks, 8 on each host.
#
# Chapter 08's rehearsal (../08_gpt_wikitext/rehearsal.sh: two network
# namespaces as root, else two launchers on 127.0.0.1) with this chapter's
# program on 8 + 8 workers. The mesh pp x dp x ep x cp x tp puts stage 0 on
# host 0 (ranks 0-7) and stage 1 on host 1 (ranks 8-15): between the hosts
# travel only the activations and their gradients (and the tied
# embedding's all-reduce); tp's all-reduces, cp's ring, ep's all-to-alls and
# the gradients' averages stay inside a host. Each step's batch is 2 ep
# replicas x 2 micro-batches x 2 sequences; the reference is this program in
# one process, holding every expert, with batch 4 and --grad_accum 2. The
# mixture is dropless and without the balancing loss (the README says why).
#
# Host 1 is killed (kill -9) once rank 0 has saved the first snapshot; its
# launcher starts again, and the whole job resumes from the snapshot on
# host 0's disk (the whole model, gathered: gpt/gather_whole.h). It passes
# when every validation loss equals the reference's within 2e-4 and the
# final l2 norms within 1e-5.
#
# Usage: 14_five_dimensions/rehearsal.sh [OPTIONS]: those of
# ../08_gpt_wikitext/rehearsal.sh (--mode, --epochs, --no_kill, --out, ...).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
moe="--n_expert 4 --moe_top_k 2 --aux_loss_coef 0 --capacity_factor 0 --grad_accum 2"
exec "$HERE/../08_gpt_wikitext/rehearsal.sh" --program "$HERE/14_five_dimensions" --reference "$HERE/14_five_dimensions" \
    --nproc0 8 --nproc1 8 --replicas 2 --worker_args "--pp 2 --ep 2 --cp 2 --tp 2 $moe" \
    --reference_args "--pp 1 $moe" --epochs 2 "$@"
