"""The newer paths on a CUDA device, each against a reference, in a few minutes
(scripts/gpu_check.sh runs it; it exits non-zero on the first mismatch, saying which):

  1. the engine core in its own process on the GPU: the same greedy tokens as in-process;
  2. Mixture of Experts (a tiny random Qwen3-MoE): GPU greedy with CUDA graphs = eager = the
     CPU's float32;
  3. `inferd serve --data-parallel-size 2` on one GPU: both replicas answer, each request the
     tokens its prompt gets alone in (1);
  4. LoRA (two adapters and the base model in one batch, a tiny Llama): the same greedy tokens as
     the CPU's float32.

    python scripts/gpu_smoke.py [--out DIR] [--device cpu] [--model M]
    (cpu: a dry run of the script; M: 1 and 3 run it instead of the embedded model, such as
    scripts/gpu_standin.py's folder)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PROMPTS = ["The capital of France is", "def fibonacci(n):", "A paged KV cache stores",
           "In 1969, the first person to walk on the moon was"]  # fmt: skip
MAX_TOKENS = 24


def greedy(llm, prompts) -> list[list[int]]:
    from inferd import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def check(name: str, ok: bool, detail: str, report: dict) -> None:
    report[name] = {"ok": ok, "detail": detail}
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        raise SystemExit(1)


def core_process(report: dict, device: str, model: str | None) -> list[list[int]]:
    from inferd import LLM

    kw = dict(model=model, device=device, dtype="bfloat16", max_model_len=512)
    if device == "cuda":  # this process holds two engines, then two replicas share the GPU
        kw["gpu_memory_utilization"] = 0.3
    llm = LLM(**kw)
    inproc = greedy(llm, PROMPTS)
    # NOTE: each prompt alone too, the reference for (3), whose requests arrive one at a time:
    # dense bf16 GEMMs round a row differently with the batch's shape.
    alone = [greedy(llm, [p])[0] for p in PROMPTS]
    proc_llm = LLM(engine_core_process=True, **kw)
    across = greedy(proc_llm, PROMPTS)
    proc_llm.shutdown()
    llm.shutdown()
    check("core process", across == inproc, f"{sum(a == b for a, b in zip(across, inproc))}/"
          f"{len(PROMPTS)} prompts equal", report)  # fmt: skip
    return alone


def moe(report: dict, device: str) -> None:
    from tiny_models import make_tiny_checkpoint

    from inferd import LLM

    folder = make_tiny_checkpoint("qwen3_moe", Path(tempfile.mkdtemp()) / "moe")
    ids = [[1, *range(20 + i, 40 + i)] for i in range(4)]
    prompts = [{"prompt_token_ids": p} for p in ids]
    kw = dict(model=str(folder), dtype="float32", max_model_len=128, kv_cache_memory=16 << 20)
    cpu = greedy(LLM(device="cpu", **kw), prompts)
    graphs = greedy(LLM(device=device, **kw), prompts)
    eager = greedy(LLM(device=device, enforce_eager=True, **kw), prompts)
    check("moe", cpu == graphs == eager, f"cpu=graphs {cpu == graphs}, cpu=eager {cpu == eager}",
          report)  # fmt: skip


def data_parallel(report: dict, reference: list[list[int]], device: str, model: str | None
                  ) -> None:  # fmt: skip
    import httpx

    port = 8311
    cmd = [sys.executable, "-m", "inferd", "serve", "--port", str(port), "--device", device,
           "--dtype", "bfloat16", "--max-model-len", "512", "--data-parallel-size", "2",
           "--data-parallel-routing", "round-robin", "--disable-log-requests",
           "--return-tokens-as-token-ids"]  # fmt: skip
    if device == "cuda":  # two replicas share the one GPU: each takes its share
        cmd += ["--gpu-memory-utilization", "0.3"]
    if model:
        cmd += ["--model", model]
    server = subprocess.Popen(cmd)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        got = []
        for p in PROMPTS:
            body = {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                    "return_tokens_as_token_ids": True, "logprobs": 1}  # fmt: skip
            r = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
            got.append(
                [int(t.removeprefix("token_id:")) for t in r["choices"][0]["logprobs"]["tokens"]]
            )
        metrics = httpx.get(url + "/metrics", timeout=10).text
        both = 'engine="0"' in metrics and 'engine="1"' in metrics
        check(
            "data parallel",
            got == reference and both,
            f"tokens equal {got == reference}, both replicas in /metrics {both}",
            report,
        )
    finally:
        server.terminate()
        server.wait(60)


def lora(report: dict, device: str) -> None:
    from lora_adapters import make_adapter
    from tiny_models import make_tiny_checkpoint

    from inferd import LLM, LoRARequest

    root = Path(tempfile.mkdtemp())
    folder = make_tiny_checkpoint("llama", root / "base")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    adapters = [LoRARequest(f"a{i}", i + 1, str(root / f"a{i}")) for i in range(2)]
    for i, a in enumerate(adapters):
        make_adapter(hf, Path(a.lora_path), seed=i, gain=4.0)
    prompts = [{"prompt_token_ids": [1, *range(20 + i, 40 + i)]} for i in range(3)]
    mix = [adapters[0], adapters[1], None]  # two adapters and the base model in one batch
    kw = dict(model=str(folder), dtype="float32", max_model_len=128, kv_cache_memory=16 << 20,
              enable_lora=True, max_loras=2)  # fmt: skip

    def run(dev: str) -> list[list[int]]:
        from inferd import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        outs = LLM(device=dev, **kw).generate(prompts, params, lora_request=mix, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]

    cpu, gpu = run("cpu"), run(device)
    differ = len({tuple(t) for t in cpu}) == len(cpu)  # the adapters change the tokens
    check("lora", cpu == gpu and differ, f"device = cpu {cpu == gpu}, adapters change the "
          f"tokens {differ}", report)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_check")
    ap.add_argument("--device", default="cuda", help="cpu: run the script's logic without a GPU")
    ap.add_argument("--model", help="for checks 1 and 3 (default: the embedded model)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    report: dict = {}
    try:
        reference = core_process(report, args.device, args.model)
        moe(report, args.device)
        data_parallel(report, reference, args.device, args.model)
        lora(report, args.device)
    finally:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "smoke.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
