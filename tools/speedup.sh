#!/usr/bin/env bash
# tools/speedup.sh - `make speedup`: measure what data parallelism buys.
#
# Trains a data-parallel chapter with 1, 2, ... ranks (up to the GPUs, or the
# CPU cores, or SPEEDUP_MAX_RANKS): the 1-rank run is the baseline, one
# process with the chapter 01 batch and learning rate; the N-rank runs are
# DDP, each rank with that batch and the learning rate scaled by N. Which
# chapter (SPEEDUP_CHAPTER):
#   05 (the default): 05_env_launch under ddprun --standalone;
#   04: 04_ddp_spawn, which spawns its ranks itself (--nprocs N): the
#       comparison chapter 04 is about, measured as a benchmark.
# Two models (SPEEDUP_MODELS, default "small large"):
#   small: the chapter 01 model (1 feature): communication dominates;
#   large: 2048 features, 16384 samples, batch 256: computation matters.
#
# Measured like a benchmark, because one run on a shared machine tells little:
#   - warm-up: the first epoch of every run is not timed (page faults, cold
#     caches); a run's time is the median of its other epochs' times, taken
#     from the per-epoch clock that rank 0 writes to train.csv;
#   - repetitions, interleaved: SPEEDUP_ROUNDS rounds (default 3), each
#     running 1, 2, ... ranks in turn, so that a busy moment hurts every
#     world size alike; the speedup of a round is its 1-rank time over its
#     N-rank time;
#   - reported: the median over the rounds, and the range (min-max), with
#     every round's numbers below each row.
# Writes runs/speedup/speedup_{small,large}.csv (COURSE_RUNS_DIR/speedup if
# set) with the columns
#   world_size,seconds_per_epoch,samples_per_s,speedup,efficiency,final_loss,
#   seconds_min,seconds_max,speedup_min,speedup_max
# plus comment lines with the command and the device, and prints the tables.
# Every run's own output stays in runs/speedup/work/MODEL-wN-rR/ (its
# train.csv) until the next measurement of that model.
set -u
cd "$(dirname "$0")/.." || exit 1
runs=${COURSE_RUNS_DIR:-runs}
out=$runs/speedup
mkdir -p "$out" || exit 1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# The cores this process may use: nproc, without the OMP_NUM_THREADS that
# `make test` (and ddprun) set, which nproc would obey.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
max=${SPEEDUP_MAX_RANKS:-$(( gpus > 0 ? gpus : cores ))}
(( max < 2 )) && max=2
rounds=${SPEEDUP_ROUNDS:-3}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "speedup: SPEEDUP_ROUNDS must be a positive number, got '$rounds'" >&2; exit 2; }
models=${SPEEDUP_MODELS:-small large}
for m in $models; do
    [[ $m == small || $m == large ]] || { echo "speedup: SPEEDUP_MODELS must name small and/or large, got '$models'" >&2; exit 2; }
done
launcher=tools/ddprun
case ${SPEEDUP_CHAPTER:-05} in
    04|04_ddp_spawn) chapter=04_ddp_spawn how="spawned by the program (--nprocs N)" ;;
    05|05_env_launch) chapter=05_env_launch how="under ddprun --standalone" ;;
    *) echo "speedup: SPEEDUP_CHAPTER must be 04 or 05, got '${SPEEDUP_CHAPTER}'" >&2; exit 2 ;;
esac
program=$chapter/$chapter
[[ -x $program && ( $chapter == 04_ddp_spawn || -x $launcher ) ]] || { echo "speedup: build first (make)" >&2; exit 1; }
export OMP_NUM_THREADS=1   # the workers compute on one thread each, 1 rank included

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# job_command W : job=(the command that starts a job of W ranks of the chapter)
job_command() {
    if [[ $chapter == 04_ddp_spawn ]]; then job=("$program" --nprocs "$1")
    else job=("$launcher" --standalone --nproc_per_node="$1" "$program"); fi
}

# epoch_time CSV : the median time of an epoch, the first one left out.
epoch_time() {
    awk -F, 'NR > 1 && /^[0-9]/ { if (n++ > 0) print $3 - last; last = $3 }' "$1" | median
}

measure() { # NAME EPOCHS SAMPLES ARGS...
    local name=$1 epochs=$2 samples=$3; shift 3
    local csv="$out/speedup_$name.csv" w r log dir job
    printf "\n%s model (%s), %s epochs (the first one untimed), %d rounds:\n" "$name" "${*:-chapter 01 defaults}" "$epochs" "$rounds"
    # times[w] = "t_round1 t_round2 ...", losses[w] = the last round's final loss
    local -a times=() losses=()
    rm -rf "$out/work/$name"-w*
    for (( r = 1; r <= rounds; r++ )); do
        for (( w = 1; w <= max; w++ )); do
            dir="$out/work/$name-w$w-r$r"
            log="$out/${name}_w$w.log"
            job_command "$w"
            if ! COURSE_RUNS_DIR="$dir" timeout 600 "${job[@]}" --epochs "$epochs" --samples "$samples" "$@" >"$log" 2>&1; then
                echo "speedup: the run with $w rank(s) failed; see $log" >&2; return 1
            fi
            local t
            t=$(epoch_time "$dir/$chapter/train.csv") || { echo "speedup: no epoch times in $dir/$chapter/train.csv" >&2; return 1; }
            times[w]="${times[w]:-} $t"
            losses[w]=$(awk -F, '/^[0-9]/ { l = $2 } END { print l }' "$dir/$chapter/train.csv")
        done
    done
    {
        echo "world_size,seconds_per_epoch,samples_per_s,speedup,efficiency,final_loss,seconds_min,seconds_max,speedup_min,speedup_max"
        # (the figure's subtitle: the model is in its legend, the full command in the table above)
        echo "# command: speedup.sh 1..$max ranks, $rounds rounds of $epochs epochs (the first untimed) of $chapter: median (min-max)"
        echo "# $(sed -n 's/.*rank 0 on \([^:]*\):.*/\1/p' "$out/${name}_w1.log" | head -n 1) | backend $(sed -n 's/.*backend \([a-z]*\).*/\1/p' "$out/${name}_w$max.log" | head -n 1) | $cores cores | $(date +%Y-%m-%d)"
    } >"$csv.tmp"
    printf '%6s %12s %21s %14s %20s %11s %12s\n' ranks "s/epoch" "(range)" "samples/s" "speedup (range)" efficiency "final loss"
    local t1=(${times[1]})
    for (( w = 1; w <= max; w++ )); do
        local tw=(${times[w]}) ratios="" i
        for (( i = 0; i < rounds; i++ )); do ratios+=" $(awk -v a="${t1[i]}" -v b="${tw[i]}" 'BEGIN { print a / b }')"; done
        local tmed tmin tmax smed smin smax
        tmed=$(printf '%s\n' ${times[w]} | median); tmin=$(printf '%s\n' ${times[w]} | sort -g | head -n 1); tmax=$(printf '%s\n' ${times[w]} | sort -g | tail -n 1)
        smed=$(printf '%s\n' $ratios | median); smin=$(printf '%s\n' $ratios | sort -g | head -n 1); smax=$(printf '%s\n' $ratios | sort -g | tail -n 1)
        awk -v w="$w" -v t="$tmed" -v t0="$tmin" -v t1="$tmax" -v n="$samples" -v s="$smed" -v s0="$smin" -v s1="$smax" -v l="${losses[w]}" 'BEGIN {
            printf "%d,%.6f,%.1f,%.4g,%.4g,%s,%.6f,%.6f,%.4g,%.4g\n", w, t, n / t, s, s / w, l, t0, t1, s0, s1 }' >>"$csv.tmp"
        tail -n 1 "$csv.tmp" | awk -F, '{ printf "%6d %12.6f %21s %14.0f %20s %10.0f%% %12s\n", $1, $2, sprintf("(%.6f-%.6f)", $7, $8),
            $3, sprintf("%.3gx (%.3g-%.3gx)", $4, $9, $10), 100 * $5, $6 }'
        echo "       rounds: s/epoch${times[w]}; speedup$ratios"
        # Above the ideal: say what can cause it, with this run's numbers.
        if awk -v s="$smed" -v w="$w" 'BEGIN { exit !(w > 1 && s > w * 1.02) }'; then
            local l3 mib
            l3=$(cat /sys/devices/system/cpu/cpu0/cache/index3/size 2>/dev/null || echo "unknown")
            mib=$(awk -v n="$samples" -v d="$(sed -n 's/.*--features \([0-9]*\).*/\1/p' <<<"--features 1 $*" | tail -n 1)" -v w="$w" \
                  'BEGIN { printf "%.1f MiB per rank instead of %.1f MiB", n * (d + 1) * 4 / w / 1048576, n * (d + 1) * 4 / 1048576 }')
            echo "       above the ideal ${w}x: each rank reads only its 1/$w of every epoch's samples ($mib; last-level cache: $l3),"
            echo "       so more of it can stay in cache; or the 1-rank runs met more competition from other work on this machine (see the range)"
        fi
    done
    mv "$csv.tmp" "$csv"
}

echo "speedup: method: $chapter $how, 1..$max ranks ($cores cores, $gpus GPUs), $rounds interleaved rounds;"
echo "speedup: a run's time is the median epoch time from rank 0's clock, the first epoch untimed; tables show the median over the rounds and (min-max)"
for m in $models; do
    case $m in
        small) measure small 6 10000 || exit 1 ;;
        large) measure large 6 16384 --features 2048 --batch_size 256 || exit 1 ;;
    esac
done
echo; echo "speedup: CSV in $out/"
