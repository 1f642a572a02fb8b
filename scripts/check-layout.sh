#!/usr/bin/env bash
# Two layout rules for the workspace's Rust sources, each offender listed, exit status 1 if any:
#
# (a) No `research/` in any `.rs` file (target/ left out). Comments cite public sources (NVIDIA's
#     and Kubernetes' docs, specifications, named files or issues of public repositories), never
#     notes kept outside the repository: a reader of this repository alone cannot open those.
# (b) No production file under daemon/src over 500 lines of production code, so no module grows
#     past what a reviewer can hold at once. Production code is a file's lines (comments and
#     blank lines included) up to, not including, the first `#[cfg(test)]` line whose next
#     non-empty line, attributes passed over, opens an inline test module (`mod tests {`); a
#     test module in a file of its own (`mod tests;`) is one line and cuts nothing. Test files
#     are skipped: names ending in `_tests.rs`, `tests.rs`, and files under a `tests/` or
#     `*_tests/` directory.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=500
failed=0

# (a) Citations of notes outside the repository.
citations=$(grep -rn --include='*.rs' --exclude-dir=target --exclude-dir=.git 'research/' . |
    sed 's|^\./||' | sort || true)
if [[ -n "$citations" ]]; then
    failed=1
    while IFS= read -r hit; do
        echo "layout: ${hit%%:*}:$(cut -d: -f2 <<<"$hit"): cites research/ (notes outside the repository; cite a public source): $(cut -d: -f3- <<<"$hit" | sed 's/^[[:space:]]*//')"
    done <<<"$citations"
fi

# (b) Production lines per file under daemon/src.
production_lines() {
    awk '
        { line[NR] = $0 }
        END {
            cut = NR
            for (i = 1; i <= NR; i++) {
                if (line[i] !~ /^#\[cfg\(test\)\]/) continue
                j = i + 1
                while (j <= NR && (line[j] ~ /^[[:space:]]*$/ || line[j] ~ /^#\[/)) j++
                if (j <= NR && line[j] ~ /^mod [A-Za-z0-9_]+ *\{/) { cut = i - 1; break }
            }
            print cut
        }' "$1"
}

while IFS= read -r -d '' file; do
    file=${file#./}
    case "/$file" in
        *_tests.rs | */tests.rs | */tests/* | *_tests/*) continue ;;
    esac
    n=$(production_lines "$file")
    if ((n > limit)); then
        failed=1
        echo "layout: $file: $n production lines, over $limit (split it into modules)"
    fi
done < <(find daemon/src -type f -name '*.rs' -print0 | sort -z)

if ((failed)); then
    exit 1
fi
echo "layout: no file over $limit production lines, no research/ citations"
