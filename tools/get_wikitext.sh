#!/usr/bin/env bash
# tools/get_wikitext.sh - download WikiText-2 (v1, tokenized) for chapter 08 and check it.
#
# Usage: tools/get_wikitext.sh [DIR]     (`make data` runs it without DIR)
#   DIR defaults to data/wikitext-2 inside the project (git-ignored). Without
#   DIR, nothing is downloaded when ../shared/data/wikitext-2 beside the
#   project already holds good copies (development and CI machines).
#   WIKITEXT_URL=BASE downloads BASE/train.txt, BASE/valid.txt, BASE/test.txt
#   from another mirror instead.
#
# Source: the copies in the pytorch/examples repository
# (word_language_model/data/wikitext-2/), byte for byte the wiki.*.tokens
# files of wikitext-2-v1.zip. WikiText-2: Merity, Xiong, Bradbury and Socher,
# "Pointer Sentinel Mixture Models" (2016); text from Wikipedia, licensed
# CC BY-SA 3.0 - keep the attribution if you pass it on.
#
# Every file is checked against its published SHA-256 before it is moved
# into place, so a failed or tampered download never leaves a bad file.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
base=${WIKITEXT_URL:-https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2}
splits=(train valid test)
declare -A expected=(
    [train]=9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f
    [valid]=f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8
    [test]=d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0
)

die() { echo "get_wikitext: error: $*" >&2; exit 1; }

if command -v sha256sum >/dev/null 2>&1; then sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then sha256_of() { shasum -a 256 "$1" | cut -d' ' -f1; }
else die "neither sha256sum nor shasum is installed; cannot check the files"; fi

# good DIR: true when DIR holds all three files with the published checksums.
good() {
    local s
    for s in "${splits[@]}"; do
        [[ -f "$1/$s.txt" && "$(sha256_of "$1/$s.txt")" == "${expected[$s]}" ]] || return 1
    done
}

if [[ $# -eq 0 ]] && good "$root/../shared/data/wikitext-2"; then
    echo "WikiText-2 is already in $(cd "$root/../shared/data/wikitext-2" && pwd) (sha256 checked); nothing to download"
    exit 0
fi
dest=${1:-$root/data/wikitext-2}

# fetch URL FILE: download with a deadline (no hanging when offline).
if command -v curl >/dev/null 2>&1; then
    fetch() { curl -fsSL --connect-timeout 15 --max-time 600 --retry 2 -o "$2" "$1"; }
elif command -v wget >/dev/null 2>&1; then
    fetch() { wget -q --timeout=15 --tries=2 -O "$2" "$1"; }
else
    die "neither curl nor wget is installed; install one, or copy train.txt, valid.txt and test.txt of WikiText-2 v1 into $dest (or set WIKITEXT_DIR=/path/to/them)"
fi

# The highest folder of dest that does not exist yet (data/, for make data):
# a download that fails removes what it created, empty folders included.
created=""
d=$dest
while [[ ! -e "$d" && "$d" != / && "$d" != . ]]; do created=$d; d=$(dirname "$d"); done
mkdir -p "$dest" || die "cannot create $dest"
partial=""
cleanup() {
    [[ -n "$partial" ]] && rm -f "$partial"
    if [[ -n "$created" ]]; then   # rmdir: only folders that are still empty
        d=$dest
        while rmdir "$d" 2>/dev/null && [[ "$d" != "$created" ]]; do d=$(dirname "$d"); done
    fi
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for s in "${splits[@]}"; do
    target="$dest/$s.txt"
    if [[ -f "$target" && "$(sha256_of "$target")" == "${expected[$s]}" ]]; then
        echo "$target: present, sha256 ok"
        continue
    fi
    partial="$dest/.$s.txt.part.$$"
    echo "downloading $base/$s.txt"
    if ! fetch "$base/$s.txt" "$partial"; then
        die "could not download $base/$s.txt (offline, or the mirror moved?). Copy train.txt, valid.txt and test.txt of WikiText-2 v1 into $dest yourself, or set WIKITEXT_DIR=/path/to/them (checksums: gpt/wikitext.h)"
    fi
    got=$(sha256_of "$partial")
    [[ "$got" == "${expected[$s]}" ]] || die "$base/$s.txt has sha256 $got, expected ${expected[$s]}; not saved"
    mv -f "$partial" "$target"
    partial=""
    echo "$target: sha256 ok"
done
created=""
echo "WikiText-2 is ready in $dest"
