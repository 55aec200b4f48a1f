#!/usr/bin/env bash
# tests/library/test_store.sh - the rendezvous store (common/store.h): its unit tests,
# then real 3-process jobs meeting through env://, tcp:// and file://, and the
# failures a user must see explained: a stale rendezvous file, a rank that never
# comes, a stranger on the store's port, a port already taken, another job's token.
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s unit/test_store unit/test_store_rdzv >"$TMP/build.log" 2>&1; then
    fail store_build "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
UNIT=$ROOT/tests/unit/test_store
RDZV=$ROOT/tests/unit/test_store_rdzv
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE COURSE_JOB_TOKEN \
      TORCHELASTIC_RESTART_COUNT LOCAL_RANK LOCAL_WORLD_SIZE

# ------------------------------------------------------------------ unit tests
run_capture 60 "$TMP/unit.log" "$UNIT"
status=$?
grep -E '^(PASS|FAIL|SKIP) ' "$TMP/unit.log"
if [[ $status -ne 0 ]] && ! grep -q '^FAIL ' "$TMP/unit.log"; then
    fail store_unit "test_store exited with status $status: $(grep -v '^PASS' "$TMP/unit.log" | tail -n 3 | tr '\n' '|')"
fi

# job_ok NAME LOGPREFIX ROUNDS : every rank's log says "ok" ROUNDS times and each exited 0.
job_ok() {
    local name=$1 prefix=$2 rounds=$3 r bad=""
    for r in 0 1 2; do
        local status; status=$(cat "$prefix.$r.status")
        local oks; oks=$(grep -c ' ok$' "$prefix.$r.log")
        if [[ $status -ne 0 || $oks -ne $rounds ]]; then
            bad+="rank $r status $status ($(tail -n 2 "$prefix.$r.log" | tr '\n' ' ')); "
        fi
    done
    [[ -z "$bad" ]]; verdict $? "$name" "$bad"
}

# start_rank PREFIX RANK [ENV=VAL ...] -- ARGS : one rank in the background, status to PREFIX.RANK.status.
start_rank() {
    local prefix=$1 rank=$2; shift 2
    local envs=()
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    ( env "${envs[@]}" timeout -k 5 40 "$RDZV" "$@" >"$prefix.$rank.log" 2>&1
      echo $? >"$prefix.$rank.status" ) &
}

# ------------------------------------------------------------------ env://
port=$(free_port)
for r in 0 1 2; do
    start_rank "$TMP/env" $r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=3 -- --rounds 2
done
wait
job_ok env_3_ranks_twice "$TMP/env" 2

# ------------------------------------------------------------------ tcp:// (ranks started in reverse)
port=$(free_port)
for r in 2 1 0; do
    start_rank "$TMP/tcp" $r -- --init_method "tcp://127.0.0.1:$port" --rank $r --world_size 3
    sleep 0.2
done
wait
job_ok tcp_3_ranks "$TMP/tcp" 1

# ------------------------------------------------------------------ a port the kernel also hands out
# Rank 1 dials before rank 0 listens, on a port from the kernel's ephemeral
# range (where connect() picks its sockets' own ports). Narrowed to 4 ports,
# the range makes rank 1's socket get the very port it dials, so that TCP
# connects it to itself: it must take that for "not listening yet" and let
# rank 0 bind the port. In a network namespace of its own (root only), so
# that the rest of the machine keeps its range.
ephemeral_job() {
    ip link set lo up && echo "40000 40003" >/proc/sys/net/ipv4/ip_local_port_range || exit 3
    start_rank "$TMP/eph" 1 COURSE_TIMEOUT=10 MASTER_ADDR=127.0.0.1 MASTER_PORT=40000 RANK=1 WORLD_SIZE=2 --
    sleep 1
    start_rank "$TMP/eph" 0 COURSE_TIMEOUT=10 MASTER_ADDR=127.0.0.1 MASTER_PORT=40000 RANK=0 WORLD_SIZE=2 --
    wait
}
if ! unshare -n true 2>/dev/null; then
    skip store_dial_meets_itself "needs root to make a network namespace (unshare -n)"
else
    (unshare -n bash -c "$(declare -f ephemeral_job start_rank); RDZV=$RDZV TMP=$TMP ephemeral_job")
    status=$?
    if [[ $status -eq 3 ]]; then
        skip store_dial_meets_itself "could not set the namespace's loopback up or its port range"
    else
        [[ $(cat "$TMP/eph.0.status" "$TMP/eph.1.status" 2>/dev/null | tr -d '\n') == 00 ]]
        verdict $? store_dial_meets_itself "rank 0: $(tail -n 1 "$TMP/eph.0.log" 2>/dev/null); rank 1: $(tail -n 1 "$TMP/eph.1.log" 2>/dev/null)"
    fi
fi

# ------------------------------------------------------------------ file://
rdzv_file=$TMP/job.rdzv
for r in 1 2 0; do
    start_rank "$TMP/file" $r -- --init_method "file://$rdzv_file" --rank $r --world_size 3 --rounds 2
done
wait
job_ok file_3_ranks_twice "$TMP/file" 2
check file_record_removed_at_close test ! -e "$rdzv_file"

# A stale record from an earlier run: garbage first, then a well-formed record
# pointing at a live store of another job (another nonce). Clients start first.
port=$(free_port)
( timeout -k 2 30 "$RDZV" --init_method "tcp://127.0.0.1:$port" --rank 0 --world_size 2 \
      >"$TMP/decoy.log" 2>&1 ) &
decoy=$!
printf 'this is not a record\n' >"$rdzv_file"
for r in 1 2; do
    start_rank "$TMP/stale" $r -- --init_method "file://$rdzv_file" --rank $r --world_size 3
done
sleep 1
printf 'course-rendezvous 1\nhost 127.0.0.1\nport %d\nnonce 00000000deadbeef\nworld 3\nstarted 1\npid 1\n' \
    "$port" >"$rdzv_file"
sleep 1
start_rank "$TMP/stale" 0 -- --init_method "file://$rdzv_file" --rank 0 --world_size 3
for r in 0 1 2; do
    for i in $(seq 450); do [[ -e $TMP/stale.$r.status ]] && break; sleep 0.1; done
    [[ -e $TMP/stale.$r.status ]] || echo 124 >"$TMP/stale.$r.status"
done
kill "$decoy" 2>/dev/null; wait
job_ok file_stale_record_ignored "$TMP/stale" 1

# ------------------------------------------------------------------ a rank that never joins
port=$(free_port)
start=$(date +%s)
for r in 0 1; do
    start_rank "$TMP/missing" $r COURSE_TIMEOUT=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=3 --
done
wait
secs=$(( $(date +%s) - start ))
[[ $(cat "$TMP/missing.0.status") -ne 0 && $(cat "$TMP/missing.1.status") -ne 0 && $secs -lt 30 ]]
verdict $? missing_rank_fails "statuses $(cat "$TMP/missing.0.status") $(cat "$TMP/missing.1.status") after ${secs}s"
expect_output missing_rank_named_rank0 "$TMP/missing.0.log" "2 of 3 ranks joined .* after 3 s; missing: rank 2"
expect_output missing_rank_named_rank1 "$TMP/missing.1.log" "missing: rank 2"

# ------------------------------------------------------------------ garbage on the store port
port=$(free_port)
start_rank "$TMP/garbage" 0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=3 --
sleep 0.5
# An HTTP request and random bytes through bash's /dev/tcp, and an idle connection.
for try in 1 2 3 4 5 6 7 8 9 10; do
    if exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null; then break; fi
    sleep 0.2
done
printf 'GET / HTTP/1.0\r\n\r\n' >&3 2>/dev/null; exec 3>&-
if exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
    head -c 4096 /dev/urandom >&3 2>/dev/null; exec 3>&-
fi
exec 4<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null
for r in 1 2; do
    start_rank "$TMP/garbage" $r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=3 --
done
wait
exec 4>&- 2>/dev/null
job_ok garbage_client_ignored "$TMP/garbage" 1
expect_output garbage_client_reported "$TMP/garbage.0.log" "dropped a connection from 127.0.0.1"

# ------------------------------------------------------------------ port already in use
port=$(free_port)
( timeout -k 2 30 "$RDZV" --init_method "tcp://127.0.0.1:$port" --rank 0 --world_size 2 \
      >"$TMP/holder.log" 2>&1 ) &
holder=$!
sleep 0.5
MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=2 run_capture 20 "$TMP/inuse.log" "$RDZV"
status=$?
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
[[ $status -ne 0 && $status -ne 124 ]]; verdict $? port_in_use_fails "exit status $status"
# Started by hand (no launcher): the advice is MASTER_PORT, not a ddprun flag.
expect_output port_in_use_message "$TMP/inuse.log" "port $port is already in use on 127.0.0.1 \(another job\? set MASTER_PORT to a free port"

# ------------------------------------------------------------------ token mismatch
port=$(free_port)
start_rank "$TMP/token" 0 COURSE_TIMEOUT=4 COURSE_JOB_TOKEN=job-a MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=2 --
sleep 0.3
start_rank "$TMP/token" 1 COURSE_TIMEOUT=4 COURSE_JOB_TOKEN=job-b MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=1 WORLD_SIZE=2 --
wait
[[ $(cat "$TMP/token.1.status") -ne 0 ]]; verdict $? token_mismatch_fails "the rank with another token was let in"
expect_output token_mismatch_message "$TMP/token.1.log" "the store at 127.0.0.1:$port belongs to another job \(token mismatch\)"

# ------------------------------------------------------------------ near misses of the token (issue 33)
# Rank 0 of a 2-rank job waits with its token; six ranks 1 that hold a near
# miss of it come first, one after the other. Each is refused at once with
# the one-line message, and the job is unharmed: the right rank 1 then
# joins, and both finish their round.
port=$(free_port)
token=Job-Token-7f3a9c
start_rank "$TMP/near" 0 COURSE_TIMEOUT=20 COURSE_JOB_TOKEN=$token MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=2 --
sleep 0.3
misses=(another:another-jobs-token empty: prefix:Job-Token-7f3a9 plus_one_byte:Job-Token-7f3a9cX
        one_byte_changed:Job-Token-7f3a9d other_case:JOB-TOKEN-7F3A9C)
for miss in "${misses[@]}"; do
    name=${miss%%:*} wrong=${miss#*:}
    COURSE_TIMEOUT=5 COURSE_JOB_TOKEN=$wrong MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=1 WORLD_SIZE=2 \
        run_capture 20 "$TMP/near_$name.log" "$RDZV"; status=$?
    [[ $status -ne 0 && $status -ne 124 && $(wc -l <"$TMP/near_$name.log") -eq 1 ]] &&
        grep -q "the store at 127.0.0.1:$port belongs to another job (token mismatch)" "$TMP/near_$name.log"
    verdict $? "token_near_miss_${name}_refused" "a rank 1 with the token '$wrong' (the job's: '$token'): status $status, output: $(head -c 300 "$TMP/near_$name.log" | tr '\n' '|')"
done
start_rank "$TMP/near" 1 COURSE_TIMEOUT=20 COURSE_JOB_TOKEN=$token MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=1 WORLD_SIZE=2 --
wait
[[ $(cat "$TMP/near.0.status" "$TMP/near.1.status" | tr -d '\n') == 00 ]] && grep -q ' ok$' "$TMP/near.0.log" && grep -q ' ok$' "$TMP/near.1.log"
verdict $? token_near_misses_job_unharmed "rank 0: $(tail -n 2 "$TMP/near.0.log" | tr '\n' '|') rank 1: $(tail -n 2 "$TMP/near.1.log" | tr '\n' '|')"
refusals=$(grep -c "refused 127.0.0.1:[0-9]*: it presented another job's token$" "$TMP/near.0.log")
[[ $refusals -eq ${#misses[@]} ]]
verdict $? token_near_misses_each_warned_once "rank 0's store warned $refusals times for ${#misses[@]} refused ranks"

# ------------------------------------------------------------------ planted bugs in the token check
# Each near-miss check above and in unit/test_store must fail on a store with
# the bug it is for (tests/lib.sh, plant): a copy of the course with the bug
# planted runs the unit test's token cases (test_store tokens).
hello_check='if (!store_token_equal(token, token_len, s->token, strlen(s->token), NULL)) {'
# planted_store NAME FILE OLD NEW CASE WHAT : the planted copy's token cases must FAIL CASE.
planted_store() {
    local bin status
    bin=$(plant "$1" "$2" "$3" "$4" tests unit/test_store)
    [[ -n $bin ]] && { run_capture 60 "$TMP/planted_$1.log" "$bin" tokens; status=$?; } &&
        [[ $status -ne 0 ]] && grep -q "^FAIL $5:" "$TMP/planted_$1.log"
    verdict $? "planted: $6 fails $5" "$(planted_why "$1")$(grep -m1 "^[A-Z]* $5" "$TMP/planted_$1.log" 2>/dev/null)"
}
planted_store prefix common/store_requests.h "$hello_check" 'if (memcmp(token, s->token, token_len) != 0) {' \
    token_refused_prefix_of_token "a token compared over the client's length only (memcmp)"
planted_store longer common/store_requests.h "$hello_check" \
    'if (strncmp((const char *)token, s->token, strlen(s->token)) != 0) {' \
    token_refused_token_plus_one_byte "a token compared over the store's length only (strncmp)"
planted_store other_case common/store_requests.h "$hello_check" \
    'if (token_len != strlen(s->token) || strncasecmp((const char *)token, s->token, token_len)) {' \
    token_refused_token_in_other_case "a token compared without regard to case"
planted_store early_exit common/store_wire.h $'        pairs++;\n' $'        pairs++;\n        if (diff) break;   // planted: stops at the first difference\n' \
    token_compare_one_byte_changed "a token comparison that stops at the first difference"

# ------------------------------------------------------------------ configuration errors
WORLD_SIZE=2 RANK=1 run_capture 10 "$TMP/noaddr.log" "$RDZV"
[[ $? -ne 0 ]] && expect_output env_needs_master_addr "$TMP/noaddr.log" "needs MASTER_ADDR" \
    || fail env_needs_master_addr "a 2-rank env:// job without MASTER_ADDR did not fail"
# A rank without a rank 0 says after 10 s what it waits for, and gives up at COURSE_TIMEOUT.
port=$(free_port)
COURSE_TIMEOUT=12 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=1 \
    run_capture 30 "$TMP/unreach.log" "$RDZV"
[[ $? -ne 0 ]] && expect_output unreachable_master_message "$TMP/unreach.log" \
    "could not reach the rendezvous store at 127.0.0.1:$port after 12 s" \
    || fail unreachable_master_message "rank 1 without a rank 0 did not fail"
expect_output unreachable_master_notice "$TMP/unreach.log" \
    "^\[rank 1\] waiting for the rendezvous store at 127\.0\.0\.1:$port \(Connection refused\); trying for [12] s more\. Is rank 0"
COURSE_TIMEOUT=soon run_capture 10 "$TMP/badtimeout.log" "$RDZV"
[[ $? -ne 0 ]] && expect_output bad_course_timeout "$TMP/badtimeout.log" "COURSE_TIMEOUT must be a number" \
    || fail bad_course_timeout "COURSE_TIMEOUT=soon was accepted"
run_capture 10 "$TMP/badmethod.log" "$RDZV" --init_method "udp://x:1"
[[ $? -ne 0 ]] && expect_output unknown_init_method "$TMP/badmethod.log" "unknown init method 'udp://x:1'" \
    || fail unknown_init_method "udp:// was accepted"
run_capture 10 "$TMP/single.log" "$RDZV"
[[ $? -eq 0 ]] && expect_output single_process_no_env "$TMP/single.log" "rank 0 of 1 round 0: sum 1 ok" \
    || fail single_process_no_env "a lone process failed: $(tail -n 2 "$TMP/single.log")"

no_leftovers store_no_leftovers "$RDZV"
