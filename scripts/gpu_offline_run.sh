#!/usr/bin/env bash
# scripts/gpu_check.sh on a GPU machine that reaches no package registry and cannot hold the
# embedded model: inferd's missing dependencies come as wheels, the model as the folder that
# scripts/gpu_standin.py prepares (its configuration and tokenizer; the weights are drawn there).
#
#   where the registry is (--python-version: the GPU machine's Python, 3.12 below):
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#         --platform manylinux_2_31_x86_64 --platform manylinux1_x86_64 \
#         -r scripts/gpu_offline_wheels.txt -d WHEELS
#     python scripts/gpu_standin.py prepare PREP     # its config and tokenizer (21 MB)
#   on the GPU machine:
#     bash scripts/gpu_offline_run.sh WHEELS PREP OUT
#
# Each step has its own timeout and appends a timed line to OUT/report.txt as it ends, so a run
# cut short still tells how far it got. Start-up first: importing torch and starting CUDA are
# timed on their own, as a cold machine can take minutes over them.
set -uo pipefail
wheels=$(realpath "$1") prep=$(realpath "$2") out=$(realpath -m "$3")
cd "$(dirname "$0")/.."
mkdir -p "$out"
log() { echo "$(date +%T) $*" | tee -a "$out/report.txt"; }
py=$(command -v python3)
# gpu_check.sh calls `python`: a wrapper running this python3, not a link (a link to a virtual
# environment's interpreter starts outside the environment, without its torch).
mkdir -p /tmp/inferd-bin
printf '#!/bin/sh\nexec %s "$@"\n' "$py" > /tmp/inferd-bin/python
chmod +x /tmp/inferd-bin/python
export PATH=/tmp/inferd-bin:$PATH PYTHONUNBUFFERED=1
log "python: $py"
# One line per stage as it ends: a stage that hangs is the one after the last line.
timeout 240 python -c '
import time; t = time.time()
def said(what): print(time.strftime("%T"), f"start-up: {what} at {time.time() - t:.1f} s", flush=True)
import torch; said(f"torch {torch.__version__} imported")
torch.ones(1, device="cuda"); said("CUDA up")
import triton; said(f"triton {triton.__version__} imported")
import transformers; said(f"transformers {transformers.__version__} imported")' 2>&1 | tee -a "$out/report.txt"
log "start-up: exit $?"
timeout 120 python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/inferd-site "$wheels"/*.whl > /tmp/inferd-install.txt 2>&1
log "wheels installed: exit $? $(tail -1 /tmp/inferd-install.txt)"
export PYTHONPATH=/tmp/inferd-site:$PWD
log "inferd: $(timeout 120 python -c 'import inferd.server.app, inferd.engine.transport.ipc; print("imports")' 2>&1 | tail -1)"
rm -rf /tmp/inferd-standin && cp -r "$prep" /tmp/inferd-standin
log "stand-in: $(timeout 180 python scripts/gpu_standin.py weights /tmp/inferd-standin 2>&1 | tail -1)"
GPU_CHECK_OUT=$out INFERD_GPU_MODEL=/tmp/inferd-standin bash scripts/gpu_check.sh
log "done"
