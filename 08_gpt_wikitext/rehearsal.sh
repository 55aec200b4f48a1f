#!/usr/bin/env bash
# rehearsal.sh - the course's finale on one machine: this chapter's GPT
# trained by one job on two "hosts", one of which dies mid-run and comes back.
#
# The two hosts are chapter 07's (07_multinode/rehearsal.sh): as root, two
# network namespaces with their own addresses (10.77.0.1 and 10.77.0.2)
# joined by a virtual cable; without root, two launchers on 127.0.0.1, and
# it says so. Each host runs in a folder of its own, as two machines would.
# This script
#   1. trains the tiny GPT in one process with the whole global batch
#      (nproc0 + nproc1) x B: the reference;
#   2. trains it again on the two hosts, nproc0 + nproc1 workers with B
#      sequences each, ddprun --max_restarts=1 on both, a snapshot after
#      every epoch (written by global rank 0, on host 0's disk);
#   3. kills host 1 (kill -9: its launcher and its workers) once host 0 has
#      saved the first snapshot, and a second later starts host 1's launcher
#      again, as a rebooted machine would: it takes the lost launcher's
#      place, and the whole job restarts from the snapshot;
#   4. compares every validation loss of the two-host run with the
#      reference's, step by step.
#
# The corpus is a small made-up one (short sentences over a 24-word
# vocabulary; --data_dir to use another), so a few hundred steps take
# seconds on a laptop and no download is needed.
#
# Usage: 08_gpt_wikitext/rehearsal.sh [OPTIONS]
#   --mode auto|netns|loopback   (auto: namespaces when allowed)
#   --nproc0 N, --nproc1 N       workers on host 0 and host 1 (2 and 1)
#   --batch_size B               sequences per worker per step (2)
#   --epochs E                   passes over the training split (4)
#   --no_kill                    train without losing host 1
#   --data_dir DIR               train.txt, valid.txt, test.txt to train on
#   --out DIR                    keep the logs, models and snapshots in DIR
#   --quiet                      do not print the hosts' output
#   --program PATH               the workers' program (this chapter's; chapter 11's
#                                finale runs its pipeline this way)
#   --worker_args "ARGS"         more arguments for every worker (e.g. "--pp 2 --tp 2")
#   --replicas R                 the data-parallel replicas the workers form (all of
#                                them): the reference trains R x B sequences a step
#   --reference_args "ARGS"      more arguments for the reference (e.g. "--grad_accum 2")
#   --reference PATH             the reference's program (08's; chapter 14's finale
#                                compares with itself in one process: a mixture of experts)
#
# Exit status 0 when the rehearsal passed: every validation loss of the
# two-host run equals the reference's within 2e-4 (the losses are printed
# with 4 decimals), the final parameters' l2 norms agree within 1e-5
# relative, the restarted job resumed from a snapshot, and host 1 wrote no
# snapshot.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PROGRAM=$HERE/08_gpt_wikitext
REFERENCE=$HERE/08_gpt_wikitext
HOSTS=$ROOT/07_multinode/rehearsal.sh

mode=auto nproc0=2 nproc1=1 batch=2 epochs=4 kill=1 data_dir="" out="" quiet=0 worker_args="" replicas="" reference_args=""
usage() { sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed '$d; s/^# \{0,1\}//' | sed '$d'; }
die_usage() {
    echo "rehearsal: error: $1" >&2
    echo "usage: $0 [OPTIONS] (see --help)" >&2
    exit 2
}
while [[ $# -gt 0 ]]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --quiet) quiet=1; shift; continue ;;
        --no_kill) kill=0; shift; continue ;;
        --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    esac
    [[ $# -ge 2 ]] || die_usage "$1 needs a value"
    case $1 in
        --mode) mode=$2 ;;
        --nproc0) nproc0=$2 ;;
        --nproc1) nproc1=$2 ;;
        --batch_size) batch=$2 ;;
        --epochs) epochs=$2 ;;
        --data_dir) data_dir=$2 ;;
        --out) out=$2 ;;
        --program) PROGRAM=$2 ;;
        --worker_args) worker_args=$2 ;;
        --replicas) replicas=$2 ;;
        --reference_args) reference_args=$2 ;;
        --reference) REFERENCE=$2 ;;
        *) die_usage "unknown option '$1'" ;;
    esac
    shift 2
done
replicas=${replicas:-$((nproc0 + nproc1))}
for v in "$nproc0" "$nproc1" "$batch" "$epochs" "$replicas"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || die_usage "expected a positive integer, got '$v'"
done
((kill == 0 || epochs >= 2)) || die_usage "losing a host needs --epochs 2 or more (a snapshot to resume from)"
for f in "$PROGRAM" "$REFERENCE" "$ROOT/tools/ddprun" "$HOSTS"; do
    [[ -x $f ]] || { echo "rehearsal: error: $f is not built; run make in $ROOT first" >&2; exit 2; }
done
keep_out=1
if [[ -z $out ]]; then out=$(mktemp -d "${TMPDIR:-/tmp}/gpt-rehearsal.XXXXXX"); keep_out=0; fi
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
trap '((keep_out)) || rm -rf "$out"' EXIT

# ---------------------------------------------------------------- the corpus
if [[ -z $data_dir ]]; then
    data_dir=$out/corpus
    mkdir -p "$data_dir"
    # WikiText's layout: " = Title = " lines, then sentences of one line each.
    awk -v dir="$data_dir" 'BEGIN {
        srand(8); split("the a every no my his one that", det, " ")
        split("king river city bird song ship horse garden", noun, " "); split("sees loves crosses finds", verb, " ")
        split("train.txt valid.txt test.txt", file, " "); split("2000 200 200", lines, " ")
        for (f = 1; f <= 3; f++)
            for (i = 0; i < lines[f]; i++) {
                if (i % 40 == 0) printf " \n = Chapter %d = \n \n", i / 40 + 1 > dir "/" file[f]
                printf " %s %s %s %s %s . \n", det[int(rand() * 8) + 1], noun[int(rand() * 8) + 1],
                    verb[int(rand() * 4) + 1], det[int(rand() * 8) + 1], noun[int(rand() * 8) + 1] > dir "/" file[f]
            } }'
fi
data_dir=$(cd "$data_dir" && pwd) || exit 2

# The same model, data and schedule everywhere; only the split of the batch differs.
world=$((nproc0 + nproc1))
train=(--data_dir "$data_dir" --verify_data=false --preset tiny --vocab_size 300 --epochs "$epochs" --eval_every 50
       --num_samples 0 --device cpu --backend cpu --out_dir run)
export OMP_NUM_THREADS=1

read -r -a more <<<"$worker_args"
read -r -a reference_more <<<"$reference_args"

# ---------------------------------------------------------------- 1. one process
echo "rehearsal: the reference: one process, batch $((replicas * batch)) ($replicas x $batch), $epochs epochs"
mkdir -p "$out/one"
(cd "$out/one" && "$REFERENCE" "${train[@]}" --batch_size $((replicas * batch)) ${reference_more[@]+"${reference_more[@]}"}) \
    >"$out/one.log" 2>&1 ||
    { echo "rehearsal: FAIL: the one-process run failed: $(tail -n 2 "$out/one.log" | tr '\n' '|')"; exit 1; }

# ---------------------------------------------------------------- 2., 3. two hosts
lose=()
((kill)) && lose=(--kill_node1_on 'snapshot saved: Epoch 1 ' --restart_node1_after 1)
echo "rehearsal: two hosts, $nproc0 + $nproc1 workers with batch $batch each$( ((kill)) && echo ", host 1 killed after the first snapshot")"
"$HOSTS" --program "$PROGRAM" --mode "$mode" --nproc0 "$nproc0" --nproc1 "$nproc1" --max_restarts 1 ${lose[@]+"${lose[@]}"} \
    --deadline 240 --out "$out/hosts" $( ((quiet)) && echo --quiet) -- \
    "${train[@]}" --batch_size "$batch" --save_every 1 --snapshot_path run/snapshots/gpt.safetensors ${more[@]+"${more[@]}"} |
    sed -u 's/^rehearsal: /hosts: /' | tee "$out/hosts.out"   # 07's script speaks for the hosts
status=${PIPESTATUS[0]}
mode=$(sed -n 's/^hosts: mode \([a-z]*\).*/\1/p' "$out/hosts.out")

# ---------------------------------------------------------------- 4. the verdict
# "STEP LOSS" for each validation, the last one printed for each step (a
# restarted job validates again after the steps it redoes).
losses() { sed -n 's/.*validation after step \([0-9]*\) (epoch [0-9]*): loss \([0-9.]*\) .*/\1 \2/p' "$1" |
           awk '{ loss[$1] = $2 } END { for (s in loss) print s, loss[s] }' | sort -n; }
l2() { sed -n 's/.*l2 norm \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
node0=$out/hosts/node0.log
losses "$out/one.log" >"$out/one.losses"
losses "$node0" >"$out/two.losses"
# "STEP ONE TWO" for every step either run validated ("-" where one did not).
awk 'NR == FNR { one[$1] = $2; steps[$1]; next } { two[$1] = $2; steps[$1] }
     END { for (s in steps) print s, (s in one ? one[s] : "-"), (s in two ? two[s] : "-") }' \
    "$out/one.losses" "$out/two.losses" | sort -n >"$out/losses"
echo "rehearsal: validation loss after each 50 steps and each epoch:"
echo "    step  one process  two hosts"
awk '{ printf "  %6s  %11s  %9s\n", $1, $2, $3 }' "$out/losses"
problems=()
((status == 0)) || problems+=("the two-host job failed (status $status)")
differ=$(awk '$2 == "-" || $3 == "-" || $2 - $3 > 2e-4 || $3 - $2 > 2e-4 { n++ } END { print n + 0 }' "$out/losses")
[[ -s $out/losses && $differ -eq 0 ]] || problems+=("$differ validation losses differ from the reference's")
a=$(l2 "$out/one.log") b=$(l2 "$node0")
awk -v a="${a:-0}" -v b="${b:--1}" 'BEGIN { d = a - b; exit !(a > 0 && d * d <= 1e-10 * a * a) }' ||
    problems+=("final l2 norms differ: ${a:-none} (one process), ${b:-none} (two hosts)")
grep -q "ranks: $world on 2 nodes" "$node0" && grep -q "^\[rank 0\]:   node 1 (.*): rank" "$node0" ||
    problems+=("rank 0 did not name both hosts")
if ((kill)); then
    resumed=$(grep -o 'Resuming training from snapshot at Epoch [0-9]*' "$node0" | tail -n 1)
    [[ -n $resumed ]] || problems+=("the restarted job did not resume from a snapshot")
fi
[[ -n $(find "$out/hosts/node0/run/snapshots" -name '*.safetensors' 2>/dev/null) ]] || problems+=("host 0 has no snapshot")
stray=$(find "$out/hosts/node1" -name '*.safetensors' 2>/dev/null | head -n 1)
[[ -z $stray ]] || problems+=("host 1 wrote $stray (only global rank 0 writes)")
if [[ ${#problems[@]} -eq 0 ]]; then
    echo "rehearsal: PASS ($mode): $nproc0 + $nproc1 workers on two hosts trained the same model as one process" \
         "(final l2 norm $b vs $a)$( ((kill)) && echo "; host 1 was killed, came back, and the job resumed (${resumed#Resuming training from })")"
    exit 0
fi
printf "rehearsal: FAIL (${mode:-?}): %s\n" "${problems[@]}"
((keep_out)) || echo "rehearsal: rerun with --out DIR to keep the logs"
exit 1
