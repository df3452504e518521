#!/usr/bin/env bash
# The house rule "no source file over 1,100 lines" (README, "How we write
# code"), checked: every C, CUDA and header file of the source tree (build
# folders left out) is at most 1,100 lines; the ones over are named, with
# their counts.
# usage: source_limits.sh SOURCE_ROOT   (run by meson)
set -u
root=${1:?usage: source_limits.sh SOURCE_ROOT}
limit=1100
over=0 files=0
while IFS= read -r -d '' file; do
    files=$((files + 1))
    lines=$(wc -l <"$file")
    if [ "$lines" -gt "$limit" ]; then
        echo "FAIL ${file#"$root"/}: $lines lines (at most $limit)"
        over=$((over + 1))
    fi
done < <(find "$root" \( -name '.*' -o -name 'build*' -o -name subprojects \) -prune -o \
              -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0)
if [ "$files" -eq 0 ]; then
    echo "FAIL no source files found under $root"
    exit 1
fi
echo "$files source files, $over over $limit lines"
[ "$over" -eq 0 ]
