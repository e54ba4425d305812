#!/usr/bin/env bash
# A/B of the CPU decoding step: gptcli/infer/decode.c at git REV (A) against the work tree's
# (B), alternated in one process (see bench/step_ab.c). Needs a C compiler with OpenMP.
#   bash bench/step_ab.sh REV [ROWS SLOT REPS [int8]]      e.g. bash bench/step_ab.sh HEAD~1 16 100 30
set -euo pipefail
rev=${1:?"usage: bash bench/step_ab.sh REV [ROWS SLOT REPS]"}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" show "$rev:gptcli/infer/decode.c" > "$work/a.c"
cp "$root/gptcli/infer/decode.c" "$work/b.c"
cc=${CC:-cc}
flags=(-O3 -march=native -fno-trapping-math -std=gnu11 -fopenmp -w)
for v in a b; do  # each version's public names renamed, so that both link into one program
  $cc "${flags[@]}" -c "$root/bench/step_ab.c" -o "$work/$v.o" -DSTEP_TU -DDECODE="\"$work/$v.c\"" -DSTEPFN=step_$v \
    -Dgptcli_pack=${v}_pack -Dgptcli_packs=${v}_packs -Dgptcli_decode_step=${v}_decode_step -Dgptcli_draw=${v}_draw
done
$cc "${flags[@]}" "$root/bench/step_ab.c" "$work/a.o" "$work/b.o" -o "$work/step_ab" -DDECODE="\"$work/b.c\"" -lm
"$work/step_ab" "${@:2}"
