# The "Coming from PyTorch" tables (top README and the chapters' "From
# PyTorch" sections) name the course's calls and link to where they are
# taught. A renamed function or a moved section must not leave them stale:
# every course function they name is defined in the course's sources, and
# every link into a README section finds that section.
source "$(dirname "$0")/../lib.sh"
cd "$ROOT" || exit 1
sources=$(ls common/*.h 0*/*.c 0*/*.h tools/*.c 2>/dev/null)

# The course's column: the second cell of each row of those tables.
table_rows() { awk '/^## (Coming from|From) PyTorch/ { on = 1; next } /^## / { on = 0 } on && /^\| /' "$1"; }
missing="" named=0
for readme in README.md [0-9][0-9]_*/README.md; do
    while IFS= read -r name; do
        named=$((named + 1))
        grep -Eq "(^|[^a-z_])$name *\(" $sources || grep -Eq "^#define $name\b|\b$name[,=]|\b$name }|^typedef .*\b$name;" $sources \
            || missing+=" $readme:$name"
    done < <(table_rows "$readme" | awk -F'|' '{ print $3 }' | grep -o '`[^`]*`' | tr -d '`' | sed 's/[a-z_/]*\.[ch]\b//g' |
             grep -oE '\b(pg|ddp|dist|sampler|snapshot|launch_env|device|rendezvous|spawn|log|rng|model|linreg)_[a-z_]+|\bspawn\b|\bOP_[A-Z]+' | sort -u)
done
[[ $named -ge 30 && -z "$missing" ]]
verdict $? "pytorch_map: the $named course names in the PyTorch tables are all defined in the sources" "$named names; not found:$missing"

# Links to README sections: the heading must exist (GitHub's anchor rules:
# lower case, spaces to '-', punctuation other than '-' and '_' dropped).
anchors() { grep '^#' "$1" | sed 's/^#* *//' | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9 _-]//g; s/ /-/g'; }
bad="" links=0
for readme in README.md [0-9][0-9]_*/README.md; do
    dir=$(dirname "$readme")
    while IFS= read -r link; do
        links=$((links + 1))
        file=${link%%#*} anchor=${link#*#}
        target="$dir/$file"; [[ -z "$file" ]] && target=$readme
        [[ -f "$target" ]] && anchors "$target" | grep -qx -- "$anchor" || bad+=" $readme->$link"
    done < <(grep -o '](\([^)#]*\)\?#[^)]*)' "$readme" | sed 's/^](//; s/)$//')
done
[[ $links -ge 6 && -z "$bad" ]]; verdict $? "pytorch_map: the $links links to README sections find their headings" "$links links; broken:$bad"
