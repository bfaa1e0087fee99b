#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU and a CUDA build of torch already installed:
# the GPU parity tests (Triton kernels compiled for real, CUDA graphs vs eager, GPU vs CPU greedy),
# the newer paths on the GPU (scripts/gpu_smoke.py: the engine core's process, Mixture of Experts,
# data-parallel replicas, LoRA), then the GPU benchmarks of issue 8, then a short report. Budget:
# under 8 minutes on an H200; every step has its own timeout, and a failing step does not stop the
# next (its log says why).
#
#   bash scripts/gpu_check.sh            # results in ./gpu_check/ (JSON + report.txt)
#
# INFERD_GPU_MODEL=DIR runs it on that model instead of the embedded one: on a machine that
# cannot install the embedded model, scripts/gpu_standin.py's folder (its shapes, random
# weights). inferd's dependencies must be importable; without inferd it installs `.[test,gpu]`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-gpu_check}
mkdir -p "$out"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')" || exit 2
python -c "import inferd" 2>/dev/null || python -m pip install -q -e ".[test,gpu]" 2>&1 | tail -2
model=${INFERD_GPU_MODEL:-}
model_args=()
[ -n "$model" ] && model_args=(--model "$model")

report() { echo "$(date +%T) $*" | tee -a "$out/report.txt"; }  # appended: a cut run keeps it
report "== $(python -c 'import torch; print(torch.cuda.get_device_name(), "torch", torch.__version__)')"
report "model: ${model:-the embedded model}"

# 1. Parity on the GPU: the Triton kernels (compiled, not interpreted), CUDA graphs, GPU greedy.
timeout 90 python -m pytest -q --maxfail=5 -p no:cacheprovider tests/gpu \
    tests/unit/test_triton_attention.py > "$out/tests.txt" 2>&1
report "tests: $(tail -1 "$out/tests.txt")"

# 1b. The engine core in its own process, MoE, data parallelism, LoRA: each against a reference.
timeout 130 python scripts/gpu_smoke.py --out "$out" "${model_args[@]}" > "$out/smoke.txt" 2>&1
report "smoke: $(grep -E '^(ok|FAIL|skip)' "$out/smoke.txt" | tr '\n' ';')"

# 2. Single stream, 128 in / 128 out, bf16, next to HF transformers on the same GPU.
timeout 80 python -m inferd bench latency --preset single --device cuda --dtype bfloat16 \
    "${model_args[@]}" --num-iters 5 --compare hf --json "$out/single.json" > "$out/single.txt" 2>&1
report "single stream: exit $? $(grep -m1 'inferd decode steps' "$out/single.txt")"
# 3. Offline, 256 requests, prompts and outputs of 100-1024 tokens (the nano-vllm workload).
timeout 110 python -m inferd bench throughput --device cuda --dtype bfloat16 --num-prompts 256 \
    "${model_args[@]}" --input-len 562 --output-len 562 --range-ratio 0.822 --compare hf \
    --json "$out/offline.json" > "$out/offline.txt" 2>&1
report "offline: exit $?"

# 4. The report: tok/s, and single-stream bandwidth against a measured copy bandwidth.
python - "$out" "$model" <<'PY' | tee -a "$out/report.txt"
import json, sys, torch
from inferd.loader import open_checkpoint
from inferd.memory import estimate_memory

out, model = sys.argv[1], sys.argv[2] or None
def figures(name):
    try:
        return json.load(open(f"{out}/{name}.json"))
    except (OSError, ValueError):
        return None

x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")  # 256 MiB
y = torch.empty_like(x)
start, end = torch.cuda.Event(True), torch.cuda.Event(True)
for _ in range(3):
    y.copy_(x)
start.record()
for _ in range(20):
    y.copy_(x)
end.record()
torch.cuda.synchronize()
copy_bw = 2 * x.numel() * 20 / (start.elapsed_time(end) / 1e3)  # read + write, bytes/s
print(f"measured copy bandwidth: {copy_bw / 1e12:.2f} TB/s")

est = estimate_memory(open_checkpoint(model).config, dtype="bf16", max_model_len=256)
weights = est.per_device.weights
for name in ("single", "offline"):
    data = figures(name)
    for r in (data or {}).get("results", []):
        line = f"{name}: {r['system']}: {r['output_throughput']:.0f} output tok/s"
        if name == "single" and r["system"] == "inferd":
            tpot = r["tpot_ms"]["median"] / 1e3
            # A decode step reads every weight once (the LM head included); KV is small here.
            achieved = weights / tpot
            line += (f", TPOT {tpot * 1e3:.2f} ms, weights read per step {weights / 1e6:.0f} MB"
                     f" -> {achieved / 1e12:.2f} TB/s = {achieved / copy_bw:.0%} of copy bandwidth")
        print(line)
    for k, v in (data or {}).get("ratios", {}).items():
        print(f"{name}: ratio {k}: {v}")
PY
report "full outputs: $out/*.txt"
