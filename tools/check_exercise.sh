#!/usr/bin/env bash
# tools/check_exercise.sh - build and run the check of one classroom exercise.
#
#   make check-exercise EX=03/ring_allreduce              check your file
#   make check-exercise EX=03/ring_allreduce SOLUTION=1   check the reference solution
#   tools/check_exercise.sh 03/ring_allreduce [--solution | --file PATH]
#   tools/check_exercise.sh --list                        list the exercises
#
# EX is the chapter's two-digit number and the exercise's name. You edit one
# file, NN_chapter/exercises/<name>.c (or .cu); the check program beside it,
# check_<name>.c, is compiled with the course's flags, linked with your file
# and run. --file checks another copy (a student's submission, say).
#
# The last line is the verdict:
#   PASSED: ...             exit 0
#   NOT YET: ...            exit 1 (what is wrong is said just above)
#   CANNOT CHECK HERE: ...  exit 77 (e.g. a CUDA exercise on a machine without a GPU)
# and exit 2 for bad usage. Environment: EXERCISE_DEADLINE (seconds, default
# 10) is how long ranks may take before a multi-rank check calls it a
# deadlock; EXERCISE_TIME_LIMIT (default 120) stops a check that loops forever.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)

list_exercises() {
    local check chapter name file
    for check in "$root"/[0-9][0-9]_*/exercises/check_*.c; do
        [[ -e "$check" ]] || continue
        chapter=$(basename "$(dirname "$(dirname "$check")")")
        name=$(basename "$check" .c); name=${name#check_}
        file=$name.c; [[ -f "$(dirname "$check")/$name.cu" ]] && file=$name.cu
        printf '  %-24s %s\n' "${chapter%%_*}/$name" "$chapter/exercises/$file"
    done
}

usage() {
    echo "usage: make check-exercise EX=NN/name [SOLUTION=1]   (or: $0 NN/name [--solution | --file PATH])" >&2
    echo "exercises:" >&2
    list_exercises >&2
    exit 2
}

ex="" variant=student file=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --list) list_exercises; exit 0 ;;
        --solution) variant=solution ;;
        --file) [[ $# -ge 2 ]] || usage; variant=other; file=$2; shift ;;
        --file=*) variant=other; file=${1#--file=} ;;
        -h|--help) usage ;;
        -*) echo "error: unknown option '$1'" >&2; usage ;;
        *) [[ -z "$ex" ]] || usage; ex=$1 ;;
    esac
    shift
done
[[ -n "$ex" ]] || { echo "error: say which exercise, e.g. EX=03/ring_allreduce" >&2; usage; }
if [[ ! "$ex" =~ ^([0-9][0-9])/([a-z0-9_]+)$ ]]; then
    echo "error: EX='$ex' is not NN/name (two-digit chapter number, slash, exercise name)" >&2
    usage
fi
number=${BASH_REMATCH[1]} name=${BASH_REMATCH[2]}
chapter_dir=$(ls -d "$root/${number}"_*/ 2>/dev/null | head -n 1)
chapter_dir=${chapter_dir%/}
exercises_dir=$chapter_dir/exercises
if [[ -z "$chapter_dir" || ! -f "$exercises_dir/check_$name.c" ]]; then
    echo "error: there is no exercise '$ex'" >&2
    usage
fi
chapter=$(basename "$chapter_dir")

# Which file to check. The starter decides the language (.c or .cu).
ext=c
[[ -f "$exercises_dir/$name.cu" ]] && ext=cu
case $variant in
    student) source=$exercises_dir/$name.$ext ;;
    solution)
        source=$root/solutions/$chapter/$name.$ext
        if [[ ! -f "$source" ]]; then
            echo "CANNOT CHECK HERE: there is no reference solution ($source is absent: solutions/ is not handed out with the course)"
            exit 77
        fi ;;
    other)
        [[ -f "$file" ]] || { echo "error: --file $file: no such file" >&2; exit 2; }
        [[ "$file" == *".$ext" ]] || { echo "error: --file $file: exercise $ex is a .$ext file" >&2; exit 2; }
        source=$(cd "$(dirname "$file")" && pwd)/$(basename "$file") ;;
esac
shown=${source#"$root"/}
echo "== checking $ex: $shown"

# Build in a folder of its own per variant (and for sanitizer builds, so
# that `make asan` does not rebuild the plain ones); the exercise file is
# always recompiled (it is one small file), so a check never runs a stale copy.
build_dir=$exercises_dir/build/$variant
[[ "${ASAN:-}" == 1 ]] && build_dir=$build_dir-asan
mkdir -p "$build_dir"
rm -f "$build_dir/check_$name" "$build_dir/build/$name.o" "$build_dir/build/$name.d"
make -s --no-print-directory -C "$build_dir" -f "$exercises_dir/Makefile" \
    EXERCISE="$name" EXERCISE_SRC="$source" "check_$name" >"$build_dir/build.log" 2>&1
status=$?
grep -v '^\[build\]' "$build_dir/build.log"
if [[ $status -ne 0 || ! -x "$build_dir/check_$name" ]]; then
    echo "NOT YET: $(basename "$source") does not compile; the compiler's messages are above"
    exit 1
fi

# Run it from the build folder, so any stray file it makes lands there. Its
# standard output is kept too: a check that ends without a verdict line
# crashed (or your code called exit()).
limit=${EXERCISE_TIME_LIMIT:-120}
(cd "$build_dir" && exec timeout -k 5 "$limit" "./check_$name") | tee "$build_dir/run.log"
status=${PIPESTATUS[0]}
verdict=$(tail -n 1 "$build_dir/run.log" | grep -E '^(PASSED|NOT YET|CANNOT CHECK HERE): ')
case $status in
    124|137) echo "NOT YET: the check got no answer within $limit s: does your code loop forever?"; status=1 ;;
    0|1|77) if [[ -z "$verdict" ]]; then
                echo "NOT YET: the check stopped (status $status) before its verdict: your code crashed or called exit(); see the messages above"
                status=1
            fi ;;
    *)
        if [[ $status -gt 128 ]]; then
            echo "NOT YET: the check crashed with signal $(kill -l $((status - 128)) 2>/dev/null || echo $((status - 128))): did your code write outside an array or use a NULL pointer?"
        else
            echo "NOT YET: the check stopped with status $status before its verdict (see the messages above)"
        fi
        status=1 ;;
esac
exit $status
