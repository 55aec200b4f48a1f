# The "Coming from PyTorch" tables (top README and the chapters' "From
# PyTorch" sections) name the course's calls and link to where they are
# taught. A renamed function or a moved section must not leave them stale:
# every course function they name is defined in the course's sources, and
# every relative link of the course's Markdown files finds its file and
# section.
source "$(dirname "$0")/../lib.sh"
cd "$ROOT" || exit 1
sources=$(ls common/*.h gpt/*.h gpt/*.cu [0-9][0-9]_*/*.c [0-9][0-9]_*/*.h tools/*.c 2>/dev/null)

# The course's column: the second cell of each row of those tables.
table_rows() { awk '/^## (Coming from|From) PyTorch/ { on = 1; next } /^## / { on = 0 } on && /^\| /' "$1"; }
missing="" named=0
for readme in README.md [0-9][0-9]_*/README.md; do
    while IFS= read -r name; do
        named=$((named + 1))
        grep -Eq "(^|[^a-z_])$name *\(" $sources || grep -Eq "^#define $name\b|\b$name[,=]|\b$name }|^typedef .*\b$name;|\b$name\[[A-Z_0-9]*\] =" $sources \
            || missing+=" $readme:$name"
    done < <(table_rows "$readme" | awk -F'|' '{ print $3 }' | grep -o '`[^`]*`' | tr -d '`' | sed 's/[a-z_/]*\.[ch]\b//g' |
             grep -oE '\b(pg|ddp|dist|sampler|snapshot|launch_env|device|rendezvous|spawn|log|rng|model|linreg|mesh|gpt)_[a-z_]+|\bspawn\b|\bOP_[A-Z]+' | sort -u)
done
[[ $named -ge 30 && -z "$missing" ]]
verdict $? "pytorch_map: the $named course names in the PyTorch tables are all defined in the sources" "$named names; not found:$missing"

# Links in every Markdown file of the course (READMEs, the measurements and
# troubleshooting files beside them): a relative link must name a file or
# folder that exists, and a link to a section (FILE.md#anchor, #anchor)
# must find a heading there (GitHub's anchor rules: lower case, spaces to
# '-', punctuation other than '-' and '_' dropped; headings inside code
# blocks do not count). Web links (http, https, mailto) are not followed.
anchors() {
    awk '/^ *```/ { code = !code; next } !code && /^#+ / { sub(/^#+ +/, ""); print }' "$1" |
        tr 'A-Z' 'a-z' | sed 's/[^a-z0-9 _-]//g; s/ /-/g'
}
bad="" links=0 sections=0
while IFS= read -r md; do
    dir=$(dirname "$md")
    while IFS= read -r link; do
        links=$((links + 1))
        file=${link%%#*} anchor=""
        [[ $link == *"#"* ]] && anchor=${link#*#}
        target="$dir/$file"; [[ -z "$file" ]] && target=$md
        if [[ ! -e "$target" ]]; then bad+=" $md->$link (no such file)"; continue; fi
        [[ -n "$anchor" ]] || continue
        sections=$((sections + 1))
        anchors "$target" | grep -qx -- "$anchor" || bad+=" $md->$link (no such heading)"
    done < <(awk '/^ *```/ { code = !code; next } !code' "$md" | grep -o '](\([^)]*\))' | sed 's/^](//; s/)$//' |
             grep -Ev '^(https?:|mailto:)')
done < <(find . -name '*.md' -not -path './.git/*' -not -path './runs/*' -not -path '*/build/*' | sort)
[[ $sections -ge 6 && $links -ge 30 && -z "$bad" ]]
verdict $? "pytorch_map: the $links relative links of the Markdown files resolve ($sections of them to a heading)" "$links links, $sections to headings; broken:$bad"

# common/README.md: it names every file of common/ that code includes or
# compiles, what its rows say a header includes is in that header, and the
# includes form no loop (tsort names the loop when there is one).
unlisted="" wrong=""
for f in common/*.h common/*.cu; do
    grep -q "\`$(basename "$f")\`" common/README.md || unlisted+=" $(basename "$f")"
done
while IFS='|' read -r _ header rest; do
    header=$(echo "$header" | grep -o '`[a-z0-9_]*\.h`' | head -n 1 | tr -d '`')
    [[ -n "$header" && -f "common/$header" ]] || continue
    for named in $(echo "${rest#*includes }" | grep -o '`[a-z0-9_]*\.h`' | tr -d '`'); do
        grep -q "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"$named\"" "common/$header" || wrong+=" $header does not include $named;"
    done
done < <(grep -E '^\| `[a-z0-9_]+\.h`.*\bincludes ' common/README.md)
loops=$(cd common && for f in *.h *.cu; do
            echo "$f $f"
            sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | sed "s|^|$f |"
        done | tsort 2>&1 >/dev/null | sed 's/^tsort: //' | paste -sd' ' | cut -c1-300)
[[ -z "$unlisted" && -z "$wrong" && -z "$loops" ]]
verdict $? "pytorch_map: common/README.md lists every header, says truly what they include, and the includes form no loop" "not listed:${unlisted:- none}; wrong:${wrong:- none}; loop: ${loops:-none}"
