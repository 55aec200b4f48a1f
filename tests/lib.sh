# tests/lib.sh - sourced by every test file (tests/*/test_*.sh).
#
# A test reports each case on its own line, which tests/run.sh counts:
#   PASS name
#   FAIL name: what went wrong, in words a student understands
#   SKIP name: why it could not run here
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/course-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# Keep every rendezvous in the tests short, so a broken test fails fast.
export COURSE_TIMEOUT=${COURSE_TIMEOUT:-60}
# Every program writes its CSVs and snapshots into this test's own fresh
# folder, never into runs/: a file a test checks was written by this test
# (not left by an earlier run), and a student's runs/ stays untouched.
export COURSE_RUNS_DIR=$TMP/runs

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }

# run_capture SECONDS OUTFILE COMMAND... : run with a deadline, stdout and
# stderr into OUTFILE; returns the command's exit status (124 on timeout).
run_capture() {
    local secs=$1 out=$2; shift 2
    timeout -k 5 "$secs" "$@" >"$out" 2>&1
}

# ---------------------------------------------------------------- one line per case
# A case is its condition, then its verdict, which names it once:
#   [[ $status -eq 0 ]] && grep -q '^final weight' "$log"; verdict $? "05: 2 ranks train" "status $status"
#   expect_near "01: weight within 0.05 of 2.0" "$w" 2.0 0.05
#   w=$(field "$log" '^learned weight: ([-0-9.e+]*)')

# verdict STATUS NAME DETAIL : PASS NAME when STATUS is 0, else FAIL NAME:
# DETAIL. STATUS is the condition's exit status, $? written right after it,
# and comes first: the $(...) in NAME or DETAIL run later and change $?
# (they run on a PASS too: keep them cheap). Returns 0, as pass and fail do.
verdict() {
    if [[ ! ${1:-} =~ ^[0-9]+$ ]]; then
        fail "${1:-verdict}" "verdict's first argument must be the condition's exit status (\$?), before the name"
    elif [[ $1 -eq 0 ]]; then pass "$2"
    elif [[ ${3:-} == "$PLANT_SKIPPED"* ]]; then skip "$2" "$PLANT_SKIPPED"   # see plant
    elif [[ ${3:-} == "$PLANT_NONE"* ]]; then skip "$2" "$PLANT_NONE"
    else fail "$2" "${3:-the condition was false}"; fi
}

# check NAME COMMAND... : PASS NAME when COMMAND succeeds (FAIL shows it).
check() {
    local name=$1; shift
    "$@"; verdict $? "$name" "check failed: $*"
}

# expect_output NAME FILE REGEX : PASS when FILE has a line matching REGEX.
expect_output() {
    grep -Eq -- "$3" "$2"; verdict $? "$1" "output lacks /$3/; it was: $(tail -n 5 "$2" | tr '\n' '|')"
}

# is_number TEXT : true when TEXT is a decimal number (1, -0.5, 3e-05), not
# empty, nan or inf: a value missing from a program's output never passes.
is_number() { [[ ${1:-} =~ ^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]; }

# near A B ATOL [RTOL] : true when A and B are numbers and
# |A - B| <= ATOL + RTOL x max(|A|, |B|) (an absolute tolerance, a relative
# one, or both: near "$w" 2 0.05; near "$a" "$b" 0 1e-5).
near() {
    is_number "$1" && is_number "$2" || return 1
    awk -v a="$1" -v b="$2" -v t="$3" -v r="${4:-0}" 'BEGIN { d = a - b; if (d < 0) d = -d
        m = a < 0 ? -a : a; n = b < 0 ? -b : b; if (n > m) m = n; exit !(d <= t + r * m) }'
}

# rel_near A B RTOL : true when |A - B| <= RTOL x max(|A|, |B|).
rel_near() { near "$1" "$2" 0 "$3"; }

# expect_near NAME GOT WANT ATOL [RTOL] : PASS NAME when near GOT WANT ATOL
# RTOL, else FAIL NAME with what it got and what was wanted.
expect_near() {
    near "$2" "$3" "$4" "${5:-0}"
    verdict $? "$1" "got '$2', wanted $3 within $4${5:+ + $5 x the larger}"
}

# field [--all] FILE REGEX [TEMPLATE] : from the last line of FILE (- for
# stdin) that REGEX matches, what its groups matched, as TEMPLATE puts them
# (default \1, the first group); with --all, from every such line, one per
# line. Empty when no line matches. REGEX is extended, as in grep -E: ( )
# make a group, \( \) \| \. \+ match the character.
#   field "$log" '^learned weight: ([-0-9.e+]*)'                      -> 1.9987
#   field "$log" 'final weight ([-0-9.]*)  bias ([-0-9.]*)' '\1 \2'   -> 1.9987 3.0012
field() {
    local all=0; [[ $1 == --all ]] && { all=1; shift; }
    local sep=$'\001' template=${3:-'\1'}
    # The match becomes "\nTEMPLATE\n" in its line; what lies between the newlines is printed.
    sed -nE "s$sep$2$sep\n$template\n$sep; T; s/^.*\n(.*)\n.*$/\1/; p" "$1" |
        if [[ $all -eq 1 ]]; then cat; else tail -n 1; fi
}

# models_apart A B : the relative L2 difference of two saved GPT models
# (tests/unit/test_gpt_compare), empty when either cannot be read. The
# parallel chapters' "equal to one process" and "resumes where it would
# have ended" checks compare with it.
models_apart() {
    field <("$ROOT/tests/unit/test_gpt_compare" "$1" "$2" 2>&1) '^relative difference ([0-9.e+-]*):'
}

# first_sample FILE : the text of a run's first sample (the lines after
# "--- sample 1", up to the next line the GPT programs print).
first_sample() {
    awk '/^--- sample 1 /{on=1; next} on && /^(saved: |final parameters|metrics: |--- sample)/{exit} on' "$1"
}

# gpt_corpus DIR : a small corpus in WikiText's layout (train.txt, valid.txt,
# test.txt of made-up sentences), for the GPT's tests: no real data needed.
gpt_corpus() {
    awk -v dir="$1" 'BEGIN { system("mkdir -p " dir); srand(11)
    split("the a one every some my your this that no", D, " "); split("cat dog bird river city king song train", N, " ")
    split("sees likes finds eats builds sings", V, " ")
    for (f = 1; f <= 3; f++) {
        file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 2000 : 200); i++) {
            if (i % 40 == 0) printf " \n = Article %d = \n \n", i > file
            printf " %s %s %s %s %s . \n", D[int(rand() * 10) + 1], N[int(rand() * 8) + 1], V[int(rand() * 6) + 1],
                D[int(rand() * 10) + 1], N[int(rand() * 8) + 1] > file } } }'
}

# has_real_gpu : true when nvidia-smi lists a GPU here.
has_real_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

# has_gpu : true when the course's GPU paths can run here: a CUDA build on
# a machine with a GPU, or the emulated GPU (CUDA=emu), which has 8.
has_gpu() { is_emu || has_real_gpu; }

# cpu_paths NAME : true when this file's checks on CPU ranks run here.
# CPU_PATHS=skip leaves them out with one SKIP line. CI sets it where they
# would run the same host code as in its CPU-only pass (.ci/run): in the
# emulated-GPU passes a GPT chapter's file, the mpi backend's and the
# collectives' run their GPU sections only (they come first in the file),
# and there and in the `make test` pass the exercises are built and run,
# but not the broken versions fed to their checks.
CPU_PATHS_SKIPPED="not run in this pass (CPU_PATHS=skip): the same host code on CPU ranks ran in CI's CPU-only pass; this pass runs what its build changes"
cpu_paths() {
    [[ ${CPU_PATHS:-run} != skip ]] && return 0
    skip "$1: the checks on CPU ranks" "$CPU_PATHS_SKIPPED"
    return 1
}

# order_matters NAME : false, with one SKIP line for NAME, in CI's pass that
# runs the GPU tests once more with the emulated GPU's work in another legal
# order (SCHEDULE_REPEAT=1, .ci/run), for checks whose answer that order
# cannot change (a training run's loss over many steps, where the kernels
# and streams it uses are checked one by one as well): they ran in the pass
# before, in the first order.
SCHEDULE_REPEAT_SKIPPED="not repeated in this pass (SCHEDULE_REPEAT=1): the order the emulated GPU runs work in cannot change its answer (the kernels and streams it uses are checked one by one in this pass); CI's emulated-GPU pass ran it"
order_matters() {
    [[ ${SCHEDULE_REPEAT:-0} != 1 ]] && return 0
    skip "$1" "$SCHEDULE_REPEAT_SKIPPED"
    return 1
}

# Every process this test file starts (and theirs, orphans included)
# inherits COURSE_TEST_RUN: leftovers are looked for among those only, so a
# test never reports, let alone kills, the processes of another test run
# (another checkout's, another engineer's) that happen to match.
export COURSE_TEST_RUN=$TMP

# ours PATTERN : the pids of this test's processes whose command line matches PATTERN.
ours() {
    local pid
    for pid in $(pgrep -f -- "$1"); do
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "COURSE_TEST_RUN=$COURSE_TEST_RUN" && echo "$pid"
    done
}

# no_shm_left NAME : a check that no shared-memory segment of a process
# group is left behind. A segment lives only while a group is being set up
# (then it is unlinked); one seen twice, a second apart, was left behind.
no_shm_left() {
    local first stale
    first=$(ls /dev/shm 2>/dev/null | grep '^course-pg-')
    [[ -n "$first" ]] && sleep 1
    stale=$(comm -12 <(echo "$first") <(ls /dev/shm 2>/dev/null | grep '^course-pg-') | grep .)
    [[ -z "$stale" ]]; verdict $? "$1" "$(echo "$stale" | head -3 | tr '\n' ' ')"
}

# no_leftovers NAME PATTERN : PASS when no process of this test whose
# command line matches PATTERN is left running (tests must not leave orphans).
no_leftovers() {
    sleep 0.3
    local pids; pids=$(ours "$2" | paste -sd, -)
    if [[ -n "$pids" ]]; then
        fail "$1" "processes left behind: $(ps -o pid=,args= -p "$pids" 2>/dev/null | head -3 | tr '\n' '|')"
        kill -9 ${pids//,/ } 2>/dev/null
    else pass "$1"; fi
}

# build_mode : the CUDA= mode the tests were built in (0, 1 or emu), read
# from the stamp course.mk leaves in tests/build.
build_mode() {
    local stamp
    stamp=$(ls "$ROOT"/tests/build/mode-* 2>/dev/null | head -n 1)
    stamp=${stamp##*/mode-}
    echo "${stamp%%-*}"
}

# is_emu : true when the course was built against the emulated GPU (CUDA=emu).
is_emu() { [[ $(build_mode) == emu ]]; }

# gpu_count : the GPUs the course's programs see here (the emulated build
# has EMU_GPUS of them, 8 unless set).
gpu_count() {
    if is_emu; then echo "${EMU_GPUS:-8}"
    else nvidia-smi -L 2>/dev/null | grep -c '^GPU'; fi
}

# free_port : a port on 127.0.0.1 that nothing listens on now, for a test
# that must name its port in advance (a rendezvous by hand, two nodes). It
# lies below the kernel's ephemeral range, where connect() takes the ports of
# its own sockets: a port from there can be in use by a connection of another
# test (or of this one, dialing early) when the store comes to bind it.
free_port() {
    local low port
    low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
    [[ $low =~ ^[0-9]+$ && $low -gt 21000 ]] || low=32768
    for _ in $(seq 50); do
        port=$((20000 + (RANDOM * 32768 + RANDOM) % (low - 20000)))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
    done
    echo 29555
}

# ---------------------------------------------------------------- planted bugs
# A check that cannot fail is no check. So a test keeps, beside a check, the
# bug that check is for: it plants the bug in a copy of the course's
# sources, builds the copy, and shows the check failing there, as the
# emulated GPU's planted-bug programs do (tests/tools/test_emu.sh). A later
# change that makes the check blind (a field that no longer matches, a
# tolerance too wide, a case that no longer reaches the code) then fails
# the suite instead of passing quietly.
#   bin=$(plant bucket_offset common/ddp.h 'grads + first, grads + first' 'grads, grads' \
#             04_ddp_spawn 04_ddp_spawn)
#   [[ -n $bin ]] && ...the check, run with "$bin"... && ! equal
#   verdict $? "04 planted: ..." "$(planted_why bucket_offset)"

# plant NAME FILE OLD NEW DIR TARGET [OLD2 NEW2 ...] : copies the course's sources (common/,
# gpt/, tools/, tests/unit/, each chapter's own files; no build outputs) to
# $TMP/plant-NAME/, there replaces the text OLD in FILE (e.g. common/ddp.h)
# by NEW, builds TARGET in the folder DIR of the copy, and prints the
# program's path. The copy is built for the CPU (CUDA=0) whatever this
# build's mode: the planted bugs live in host code, and one CPU program
# builds in seconds. PLANT_CUDA=emu builds it for the emulated GPU instead
# (a bug in GPU code): the copy links this checkout's emu/, built already
# in a CUDA=emu build, so only the copy's own files compile. Prints
# nothing and fails when OLD does not occur exactly once in FILE (the code
# changed: the planted bug must move with it, never be dropped without a
# word) or the build fails; planted_why NAME then says which.
#
# PLANTED_BUGS=skip leaves the CPU copies out (they SKIP, saying why): they
# are the same programs whatever the build under test, so CI runs them in
# its CPU-only pass only and spares its other passes the builds (.ci/run).
# The copies for the emulated GPU (PLANT_CUDA=emu) run in every pass but
# one: PLANTED_BUGS=none leaves out every copy, for CI's pass that runs the
# same tests once more in another schedule of the emulated GPU.
PLANT_NONE="planted bug not built in this pass (PLANTED_BUGS=none): CI builds and runs every planted copy in an earlier pass; this one repeats the tests in another schedule"
PLANT_SKIPPED="planted bug not built in this pass (PLANTED_BUGS=skip): its copy is a CPU build, the same whatever the build under test; CI runs it in its CPU-only pass"
plant() {
    local copy=$TMP/plant-$1 why=$TMP/plant-$1.why file=$2 old=$3 new=$4 text rest count more=("${@:7}")
    if [[ ${PLANTED_BUGS:-run} == skip && ${PLANT_CUDA:-0} != emu ]]; then
        echo "$PLANT_SKIPPED" >"$why"
        return 1
    fi
    if [[ ${PLANTED_BUGS:-run} == none ]]; then
        echo "$PLANT_NONE" >"$why"
        return 1
    fi
    rm -rf "$copy" "$why" && mkdir -p "$copy" || return 1
    (cd "$ROOT" && find common gpt tools tests/unit tests/Makefile [0-9][0-9]_*/ -maxdepth 1 -type f \
        \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.mk' -o -name Makefile \) -print0 |
        xargs -0 cp --parents -t "$copy") || { echo "could not copy the sources" >"$why"; return 1; }
    text=$(cat "$copy/$file" && printf x) || { echo "no file $file" >"$why"; return 1; }
    text=${text%x}
    rest=${text//"$old"/}
    count=$(( (${#text} - ${#rest}) / ${#old} ))
    if [[ $count -ne 1 ]]; then
        echo "the planted bug's text '$old' occurs $count times in $file, not once: the code changed; move the planted bug with it" >"$why"
        return 1
    fi
    text=${text/"$old"/"$new"}
    # More OLD NEW pairs after TARGET: other bugs planted in the same FILE of
    # the same copy, each caught by a check of its own (one build for all).
    while [[ ${#more[@]} -ge 2 ]]; do
        rest=${text//"${more[0]}"/}
        count=$(( (${#text} - ${#rest}) / ${#more[0]} ))
        if [[ $count -ne 1 ]]; then
            echo "the planted bug's text '${more[0]}' occurs $count times in $file, not once: the code changed; move the planted bug with it" >"$why"
            return 1
        fi
        text=${text/"${more[0]}"/"${more[1]}"}
        more=("${more[@]:2}")
    done
    printf '%s' "$text" >"$copy/$file"
    if [[ ${PLANT_CUDA:-0} == emu ]]; then ln -s "$ROOT/emu" "$copy/emu" || return 1; fi
    if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -s -C "$copy/$5" CUDA="${PLANT_CUDA:-0}" ASAN=0 "$6" \
            >"$copy/make.log" 2>&1; then
        echo "the copy with the planted bug did not build: $(grep -m3 -E 'error|Error' "$copy/make.log" | tr '\n' '|')" >"$why"
        return 1
    fi
    echo "$copy/$5/$6"
}

# planted_why NAME : why plant NAME gave no program (empty when it gave one).
planted_why() { cat "$TMP/plant-$1.why" 2>/dev/null; }

# ---------------------------------------------------------------- AdamW's moments, from a snapshot
# A gradient N times too large barely moves AdamW's weights (its step is
# m / sqrt(v), the same for any scale) and not at all while clipping is
# active; its moments show it (m N times, v N^2 times larger). The GPT
# chapters' equal-to-one-process checks compare them, unclipped.
# snapshot_norms DIR: "P M V", the l2 norms of the parameters and of
# AdamW's moments m and v in the snapshot DIR holds (s.*.safetensors: an
# 8-byte header length, the JSON header with each tensor's byte range, the floats).
snapshot_norms() {
    local file h header t range out=""
    file=$(ls "$1"/s.*.safetensors 2>/dev/null | tail -n 1)
    [[ -n $file ]] || return 1
    h=$(od -An -tu8 -N8 "$file" | tr -d ' ')
    header=$(head -c $((8 + h)) "$file" | tail -c "$h")
    for t in params adam_m adam_v; do
        range=$(grep -o "\"$t\":{[^}]*}" <<<"$header" | grep -o '"data_offsets":\[[0-9]*,[0-9]*\]' | grep -o '[0-9][0-9]*,[0-9]*')
        [[ -n $range ]] || return 1
        out+=$(od -An -v -tf4 -j $((8 + h + ${range%,*})) -N $((${range#*,} - ${range%,*})) "$file" |
            awk '{ for (i = 1; i <= NF; i++) s += $i * $i } END { printf "%.9g ", sqrt(s) }')
    done
    echo "${out% }"
}
# norms_near "P M V" "P M V" TOL: every one of the three within TOL (relative).
norms_near() {
    local a=($1) b=($2) k
    [[ ${#a[@]} -eq 3 && ${#b[@]} -eq 3 ]] || return 1
    for k in 0 1 2; do rel_near "${a[$k]}" "${b[$k]}" "$3" || return 1; done
}
