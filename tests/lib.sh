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

# check NAME CONDITION-COMMAND... : PASS when the command succeeds.
check() {
    local name=$1; shift
    if "$@"; then pass "$name"; else fail "$name" "check failed: $*"; fi
}

# run_capture SECONDS OUTFILE COMMAND... : run with a deadline, stdout and
# stderr into OUTFILE; returns the command's exit status (124 on timeout).
run_capture() {
    local secs=$1 out=$2; shift 2
    timeout -k 5 "$secs" "$@" >"$out" 2>&1
}

# expect_output NAME FILE REGEX : PASS when FILE has a line matching REGEX.
expect_output() {
    if grep -Eq -- "$3" "$2"; then pass "$1"
    else fail "$1" "output lacks /$3/; it was: $(tail -n 5 "$2" | tr '\n' '|')"; fi
}

# near A B TOL : true when |A - B| <= TOL (numbers as text).
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }

# rel_near A B RTOL : true when |A - B| <= RTOL * max(|A|, |B|, 1e-30).
rel_near() {
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
        m = a < 0 ? -a : a; n = b < 0 ? -b : b; if (n > m) m = n; if (m < 1e-30) m = 1e-30;
        exit !(d <= t * m) }'
}

# small_corpus DIR : a small corpus in WikiText's layout in DIR (train.txt,
# valid.txt, test.txt: 2000, 200 and 200 short sentences under article
# headings), the same every time, for the GPT's tests (no real data needed).
small_corpus() {
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
