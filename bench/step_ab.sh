#!/usr/bin/env bash
# A/B of the CPU decoding step: gptcli/infer/decode.c at git REV (A) against the work tree's
# (B), alternated in one process (see bench/step_ab.c). Needs a C compiler with OpenMP.
#   bash bench/step_ab.sh REV [ROWS SLOT REPS [bf16|int8|fp32] [SHARED] [CACHE_LEN]]   e.g. bash bench/step_ab.sh HEAD~1 16 100 30
set -euo pipefail
rev=${1:?"usage: bash bench/step_ab.sh REV [ROWS SLOT REPS [bf16|int8|fp32] [SHARED] [CACHE_LEN]]"}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" show "$rev:gptcli/infer/decode.c" > "$work/a.c"
cp "$root/gptcli/infer/decode.c" "$work/b.c"
cc=${CC:-cc}
flags=(-O3 -march=native -fno-trapping-math -std=gnu11 -fopenmp -w)
names=$(cat "$work/a.c" "$work/b.c" | grep -o '^[a-z].*\bgptcli_[a-z0-9_]*(' | grep -o 'gptcli_[a-z0-9_]*' | sort -u)
rename() {  # a version's public names (gptcli_*), prefixed, so that several link into one program
  for name in $names; do echo "-D$name=$1_${name#gptcli_}"; done
}
for v in a b; do
  # shellcheck disable=SC2046
  $cc "${flags[@]}" -c "$work/$v.c" -o "$work/$v.o" $(rename $v)
done
# shellcheck disable=SC2046
$cc "${flags[@]}" "$root/bench/step_ab.c" "$work/a.o" "$work/b.o" -o "$work/step_ab" -DDECODE="\"$work/b.c\"" \
  $(rename driver) -lm
"$work/step_ab" "${@:2}"
