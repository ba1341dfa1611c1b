#!/usr/bin/env bash
# The device check: the CUDA-only paths and the real-shape benchmarks, in under 10 minutes on one large GPU
# (80-140 GB). Every step writes its JSON under OUT; summary.json says which steps passed.
#
#     benchmarks/gpu_check.sh OUT            # on the GPU machine (COMFYUI_PATH set: native ComfyUI too)
#     benchmarks/gpu_check.sh OUT --dry-run  # anywhere: the same steps at tiny shapes on the CPU, the suite
#                                            # on the meta device (no timings): the plumbing, before a GPU
#
# Steps (seconds allowed on the GPU, 600 in all; a step past its limit is stopped, the others still run):
#   plan       the suite's --gpu-real memory, added up on the meta device and checked against this card  (20)
#   suite      klein 4B and 9B at their real shapes, bf16: ours vs diffusers vs native (DiT cases, the
#              step cache's skipped step, text, VAE, end to end); its JSON grows shape by shape       (170)
#   suite_fp8  the same DiT cases with fp8 block weights (ours and native: scaled fp8 as fp8 files
#              store it; diffusers: its layerwise fp8 casting), edits with 4 references             (100)
#   formats    every checkpoint format (fp8, nvfp4, int8, GGUF) against bf16, real klein 4B widths   (45)
#   quant_compute  a klein 4B and 9B step (real widths, 1+4 blocks) from fp8, nvfp4, W4A8 and AWQ
#              files: ours in format (auto), ours dequantised, native ComfyUI, bf16                   (70)
#   control    a FLUX.2 [dev] step under the Fun ControlNet against the plain one, dev's real widths
#              with half of every part (4 + 24 blocks, 2 control blocks), 1024²                         (30)
#   ops        a DiT step with the plain block ops against the fused ones (FLUX2_BLOCK_OPS=plain /
#              fused), klein 4B's 24 heads x 128 with 1 + 4 blocks, 1024²                              (20)
#   compile    the same step compiled (torch.compile of the whole DiT forward) against eager; the
#              compile time apart                                                                       (50)
#   streaming  block streaming's cost against resident weights, real klein 4B widths                  (30)
#   interrupt  a streamed run stopped mid-step (cancel, out of memory), then a clean run             (30)
#   parallel   two processes, tensor and sequence parallel, against one (NCCL; needs two GPUs)       (35)
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu_check.sh OUT [--dry-run]}
DRY=${2:-}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
cd "$HERE"

if [ "$DRY" = "--dry-run" ]; then
    DEVICE=cpu DTYPE=float32 SCALE=(--heads 2 --depth 1 --single 1) SIZE=64 TOKENS=64 LIMIT=300
    STEP=("${SCALE[@]}" --size 64 --repeats 1)  # the ops / compile steps' DiT
    SUITE=(--gpu-real --dry-run --shapes klein-4b klein-9b --card-gb 80)
    FP8=("${SUITE[@]}" --weights fp8)
else
    DEVICE=cuda DTYPE=bfloat16 SCALE=(--heads 24 --depth 2 --single 8) SIZE=1024 TOKENS=4096 LIMIT=
    STEP=(--heads 24 --depth 1 --single 4 --size 1024 --repeats 5)
    SUITE=(--gpu-real --shapes klein-4b klein-9b --rounds 2 --skip load --svg "$OUT/suite_bf16.svg")
    FP8=(--gpu-real --shapes klein-4b klein-9b --rounds 2 --refs 4 --skip text vae e2e load --weights fp8)
fi

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    uname -a
    grep -m1 "model name" /proc/cpuinfo || true
    grep -m1 -o -w -E "amx_bf16|avx512f|avx2" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$OUT/machine.txt" 2>&1

# What the steps import beyond the pack itself, checked before the first one: the test extras bring them all.
if ! "$PYTHON" -c "import diffusers, transformers, safetensors, numpy, flux2_core" > "$OUT/packages.log" 2>&1; then
    echo "the device check needs the pack and its test extras (diffusers, transformers, ...):" >&2
    echo "    pip install -e \".[test]\"    (from the repository's root), then run it again" >&2
    tail -n 1 "$OUT/packages.log" >&2
    exit 2
fi

STEPS="plan suite suite_fp8 formats quant_compute control ops compile streaming interrupt parallel"
declare -A STATUS
step() {  # step NAME SECONDS COMMAND...: run it with a time limit, keep its log, record how it ended
    local name=$1 seconds=${LIMIT:-$2}
    shift 2
    echo "== $name (up to ${seconds}s)"
    local start=$SECONDS
    timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    STATUS[$name]="{\"rc\": $rc, \"seconds\": $((SECONDS - start))}"
    tail -n 4 "$OUT/$name.log"
    [ $rc -eq 0 ] || echo "   $name failed (exit $rc): see $OUT/$name.log"
}

step plan 20 "$PYTHON" suite.py --gpu-real --dry-run --shapes klein-4b klein-9b --json "$OUT/plan.json"
step suite 170 "$PYTHON" suite.py "${SUITE[@]}" --json "$OUT/suite_bf16.json"
step suite_fp8 100 "$PYTHON" suite.py "${FP8[@]}" --json "$OUT/suite_fp8.json"
step formats 45 bash -c "set -o pipefail; '$PYTHON' formats_memory.py --device $DEVICE --dtype $DTYPE ${SCALE[*]} \
    --tokens $TOKENS | tail -n 1 > '$OUT/formats.json'"
if [ "$DRY" = "--dry-run" ]; then QC=(--dry-run); else QC=(--depth 1 --single 4 --size 1024 --repeats 3); fi
QC+=(--formats fp8 nvfp4 w4a8 awq)
step quant_compute 70 "$PYTHON" quant_compute.py "${QC[@]}" --json "$OUT/quant_compute.json"
if [ "$DRY" = "--dry-run" ]; then CC=(--heads 2 --size 64 --text-tokens 8 --share-single --repeats 1)
else CC=(--quarters 2 --size 1024 --repeats 3); fi
step control 30 "$PYTHON" control_cost.py --device "$DEVICE" --dtype "$DTYPE" "${CC[@]}" --json "$OUT/control.json"
step ops 20 "$PYTHON" block_ops_cost.py --compare ops --device "$DEVICE" --dtype "$DTYPE" "${STEP[@]}" \
    --json "$OUT/block_ops.json"
step compile 50 "$PYTHON" block_ops_cost.py --compare compile --device "$DEVICE" --dtype "$DTYPE" "${STEP[@]}" \
    --json "$OUT/compile.json"
step streaming 30 "$PYTHON" streaming_cost.py --device "$DEVICE" --dtype "$DTYPE" "${SCALE[@]}" \
    --size "$SIZE" --repeats 3 --json "$OUT/streaming_cost.json"
step interrupt 30 "$PYTHON" streaming_interrupt.py --device "$DEVICE" --dtype "$DTYPE" "${SCALE[@]}" \
    --size "$SIZE" --steps 3 --json "$OUT/streaming_interrupt.json"
step parallel 35 "$PYTHON" nccl_check.py --device "$DEVICE" --json "$OUT/parallel.json"

{
    echo "{"
    echo "  \"dry_run\": $([ "$DRY" = "--dry-run" ] && echo true || echo false),"
    first=1
    for name in $STEPS; do
        [ $first -eq 1 ] || echo ","
        first=0
        printf '  "%s": %s' "$name" "${STATUS[$name]}"
    done
    echo
    echo "}"
} > "$OUT/summary.json"
cat "$OUT/summary.json"
for name in $STEPS; do
    case "${STATUS[$name]}" in *'"rc": 0,'*) ;; *) exit 1 ;; esac
done
