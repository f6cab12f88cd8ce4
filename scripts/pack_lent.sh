#!/usr/bin/env bash
# scripts/pack_lent.sh: pack into .lent/site what `make gpu-check-lent` needs on a lent GPU machine (docs/gpus.md,
# "A lent GPU machine"): the project as its own wheel (tasks/, conf/ and tables/paper/ inside it) and the
# dependencies a gpu-check run imports that such a machine's image lacks, unpacked, so that its own python and
# torch run them with nothing installed (no network there; 64 MiB carried). Run it here, where the registry is:
#
#     scripts/pack_lent.sh            # then carry .lent (git-ignored)
#
# What a gpu-check --quick run imports beyond torch, numpy and Triton (the image's): hydra-core, omegaconf,
# antlr4-python3-runtime, pyyaml, tqdm, packaging, tabulate. Versions: those of the project's venv (PY), else
# the registry's newest. pyyaml is the one binary among them: its wheel for LENT_PYTHON_VERSION (default 3.12);
# on another Python its C part does not load and PyYAML runs its pure-Python code. LENT_BINARY adds binary
# packages for that Python (e.g. LENT_BINARY=numpy where an image has none).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
PYV=${LENT_PYTHON_VERSION:-3.12}
OUT=.lent
PURE="hydra-core omegaconf tqdm packaging tabulate"
BINARY="pyyaml ${LENT_BINARY:-}"

pin() {  # name==the version installed beside PY, or the name alone
    local v
    v=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1" 2>/dev/null || true)
    if [ -n "$v" ]; then echo "$1==$v"; else echo "$1"; fi
}
pins() { for p in "$@"; do pin "$p"; done; }

rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/site"
# shellcheck disable=SC2046
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$OUT/wheels" $(pins $PURE)
# antlr4-python3-runtime 4.9.3 (omegaconf 2.3's pin) is published as source only: build its pure-Python wheel here
"$PY" -m pip wheel -q --no-deps -w "$OUT/wheels" "$(pin antlr4-python3-runtime)"
# shellcheck disable=SC2046
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux2014_x86_64 -d "$OUT/wheels" $(pins $BINARY)
# the project: a checkout's birder_repro/tasks (a link) does not travel, the wheel maps tasks/ into the package
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/wheels" .
for w in "$OUT"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$OUT/site"; done
ls "$OUT"/wheels > "$OUT/PACKED"
rm -rf "$OUT/wheels" build
echo "scripts/pack_lent.sh: $(du -sh "$OUT" | cut -f1) in $OUT ($(tr '\n' ' ' < "$OUT/PACKED")); carry it, then run"
echo "  make gpu-check-lent    (or: cd .lent && PYTHONPATH=\$PWD/site python3 -m birder_repro.gpucheck --quick --out ../runs/gpu-check-lent)"
