# Snapshots (common/snapshot.h): the unit tests (round trip, layout on disk,
# every kind of damage refused with its own message, keep-K, fallback, fuzz),
# then separate processes: a writer killed with SIGKILL in the middle of a
# write must leave the older snapshot loadable and no half-written file
# under a snapshot's name.
source "$(dirname "$0")/../lib.sh"
unit="$ROOT/tests/unit/test_snapshot"
tool="$ROOT/tests/unit/test_snapshot_tool"
for bin in "$unit" "$tool"; do
    if [[ ! -x "$bin" ]]; then fail "snapshot: test programs are built" "$bin is missing (run make -C tests)"; exit 1; fi
done

"$unit" "$TMP/unit"
status=$?
[[ $status -ne 0 ]] && fail "snapshot: unit tests" "test_snapshot exited with status $status (a crash if no FAIL line above)"

# stat -c %s, the file's size in bytes
size_of() { stat -c %s "$1"; }
# The hidden temporary file of STEP in DIR, if any.
temp_of() { ls -A "$1" 2>/dev/null | grep -E "^\.snapshot\.$(printf %010d "$2")\.safetensors\.[0-9]+\.tmp$" | head -n 1; }

# start_and_kill DIR STEP : saves STEP with a pause halfway through the data,
# and kills the writer with SIGKILL once the temporary file holds that half.
start_and_kill() {
    local dir=$1 step=$2 tmp="" i
    COURSE_SNAPSHOT_PAUSE_MS=30000 "$tool" save "$dir/snapshot.safetensors" "$step" 2 4 >"$TMP/writer.out" 2>&1 &
    local pid=$!
    for ((i = 0; i < 300; i++)); do
        tmp=$(temp_of "$dir" "$step")
        [[ -n "$tmp" && $(size_of "$dir/$tmp") -ge $((2 * 1024 * 1024)) ]] && break
        tmp=""
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    [[ -n "$tmp" ]]
}

# ---- SIGKILL in the middle of writing step 3, with steps 1 and 2 saved
dir="$TMP/kill"
run_capture 60 "$TMP/save.out" "$tool" save "$dir/snapshot.safetensors" 1 2 1 &&
    run_capture 60 "$TMP/save.out" "$tool" save "$dir/snapshot.safetensors" 2 2 1
check "snapshot: save steps 1 and 2" test $? -eq 0
start_and_kill "$dir" 3
verdict $? "snapshot: writer killed with SIGKILL halfway through the data" "no temporary file with half the data appeared within 30 s"
check "snapshot: no file named like step 3 after the kill" test ! -e "$dir/snapshot.0000000003.safetensors"
bad=""
for f in "$dir"/*.safetensors; do
    "$tool" read "$f" >"$TMP/read.out" 2>&1 || bad="$bad $(basename "$f"): $(head -n 1 "$TMP/read.out");"
done
[[ -z "$bad" ]]; verdict $? "snapshot: every file named like a snapshot is complete after the kill" "$bad"
run_capture 60 "$TMP/load.out" "$tool" load "$dir/snapshot.safetensors"
expect_output "snapshot: the older snapshot loads after the kill (temp file ignored)" "$TMP/load.out" '^loaded step 2 from .*snapshot\.0000000002\.safetensors$'
run_capture 60 "$TMP/save.out" "$tool" save "$dir/snapshot.safetensors" 3 2 1
run_capture 60 "$TMP/load.out" "$tool" load "$dir/snapshot.safetensors"
grep -q '^loaded step 3 ' "$TMP/load.out" && [[ -z "$(temp_of "$dir" 3)" ]] &&
    [[ "$(ls "$dir" | tr '\n' ' ')" == "snapshot.0000000002.safetensors snapshot.0000000003.safetensors " ]]
verdict $? "snapshot: saving again replaces the stale temp file and keeps the newest 2" "files: $(ls -A "$dir" | tr '\n' ' '); load: $(cat "$TMP/load.out")"

# ---- damaged newest snapshot: load falls back and says why
newest="$dir/snapshot.0000000003.safetensors"
offset=$(( $(size_of "$newest") - 100 ))
byte=$(od -An -tu1 -j "$offset" -N1 "$newest" | tr -d ' ')
printf "\\$(printf %03o $((255 - byte)))" | dd of="$newest" bs=1 seek="$offset" conv=notrunc status=none
run_capture 60 "$TMP/load.out" "$tool" load "$dir/snapshot.safetensors"
status=$?
[[ $status -eq 0 ]] && grep -q '^loaded step 2 ' "$TMP/load.out" &&
    grep -q 'snapshot.0000000003.safetensors is damaged (checksum mismatch' "$TMP/load.out" &&
    grep -q '^resuming from older snapshot .*snapshot.0000000002.safetensors$' "$TMP/load.out"
verdict $? "snapshot: a flipped byte in the newest falls back to the older one and says why" "status $status: $(tr '\n' '|' <"$TMP/load.out")"
truncate -s -1000 "$dir/snapshot.0000000002.safetensors"
run_capture 60 "$TMP/load.out" "$tool" load "$dir/snapshot.safetensors"
status=$?
[[ $status -eq 1 ]] && grep -q 'snapshot.0000000002.safetensors is damaged (.*end beyond the data' "$TMP/load.out" &&
    grep -q '^no valid snapshot$' "$TMP/load.out"
verdict $? "snapshot: no valid snapshot left is an error that names each file" "status $status: $(tr '\n' '|' <"$TMP/load.out")"

# ---- SIGKILL during the very first snapshot: there is simply none yet
dir="$TMP/first"
start_and_kill "$dir" 1
run_capture 60 "$TMP/load.out" "$tool" load "$dir/snapshot.safetensors"
status=$?
[[ $status -eq 3 ]] && [[ -z "$(ls "$dir")" ]] && [[ -n "$(temp_of "$dir" 1)" ]]
verdict $? "snapshot: a kill during the first write leaves no snapshot, only a hidden temp file" "status $status, files: $(ls -A "$dir" | tr '\n' ' ')"

no_leftovers "snapshot: no writer left running" "test_snapshot_tool save $TMP"
