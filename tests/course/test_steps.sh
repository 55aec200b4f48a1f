# The parallelism chapters are steps: each GPT chapter's main file is 08's
# plus its idea. `make diffs` shows the idea only if the rest stays 08's,
# so the size of each diff is held to what the idea needs (issue 41's
# bounds: 180 changed lines for ZeRO, 160 for tensor parallelism, 280 for
# pipelines; issue 42's: 180 for context parallelism; 180 for experts), 08's main file to 300 lines and every main file to 500; and
# no chapter computes a rank from mesh coordinates by hand (common/groups.h
# does, in one dimension order for all).
source "$(dirname "$0")/../lib.sh"
base=08_gpt_wikitext/08_gpt_wikitext.c
# changed FILE: the lines of `diff 08 FILE` that are 08's or FILE's.
changed() { diff "$ROOT/$base" "$ROOT/$1" | grep -c '^[<>]'; }
lines=$(wc -l <"$ROOT/$base")
[[ $lines -le 300 ]]; verdict $? "steps: 08's main file is at most 300 lines ($lines)" "$lines lines: move what is not the lesson into gpt/"
for pair in 09_zero_fsdp:180 10_tensor_parallel:160 11_pipeline_parallel:280 12_context_parallel:180 13_expert_parallel:180; do
    c=${pair%%:*} most=${pair#*:} f=${pair%%:*}/${pair%%:*}.c
    n=$(changed "$f") lines=$(wc -l <"$ROOT/$f")
    [[ $n -le $most ]]; verdict $? "steps: 08 -> $c is $n changed lines (at most $most)" "$n lines: the chapter's machinery belongs in its headers, what 08 shares in gpt/"
    [[ $lines -le 500 ]]; verdict $? "steps: $f is at most 500 lines ($lines)" "$lines lines"
done
# The finale (issue 44) is 11 plus cp and ep: its diff is taken from 11's
# main file, and held to 200 changed lines (how the dimensions compose).
f=14_five_dimensions/14_five_dimensions.c
n=$(diff "$ROOT/11_pipeline_parallel/11_pipeline_parallel.c" "$ROOT/$f" | grep -c '^[<>]') lines=$(wc -l <"$ROOT/$f")
[[ $n -le 200 ]]; verdict $? "steps: 11 -> 14_five_dimensions is $n changed lines (at most 200)" "$n lines: the finale's machinery belongs in finale.h, what 11 shares in gpt/"
[[ $lines -le 500 ]]; verdict $? "steps: $f is at most 500 lines ($lines)" "$lines lines"
# Rank arithmetic on mesh coordinates - a rank from a stage times a size,
# a coordinate from a rank divided by a stride - lives in common/groups.h.
found=$(grep -nE '(rank|from|peer) *= *[a-z_>.-]*(stage|replica|shard|coord)[a-z_]* *\* *|rank *[/%] *(p->|g->)?(shards|replicas|stages|size)' \
    "$ROOT"/1[0-9]_*/*.[ch] "$ROOT"/gpt/*.h 2>/dev/null | grep -v 'groups.h')
[[ -z $found ]]; verdict $? "steps: no rank computed from mesh coordinates outside common/groups.h" "$found"
# Planted: 11's old rank-of-coordinates, written back by hand, is found.
printf 'int from = stage * p->replicas * p->shards + shard;\n' >"$TMP/planted.c"
grep -qE '(rank|from|peer) *= *[a-z_>.-]*(stage|replica|shard|coord)[a-z_]* *\* *' "$TMP/planted.c"
verdict $? "steps planted: a rank computed by hand from stage and sizes is seen by the check above" "the pattern missed it"
