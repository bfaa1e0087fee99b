"""Benchmarks with vLLM's metric definitions: offline throughput, batch latency, a serving
client with Poisson arrivals, start-up time, and the peers (llama.cpp, HF transformers) run on
the same workload for ratios. `inferd bench` (inferd/commands/bench.py) is the entry point.

    metrics.py     TTFT / TPOT / ITL / E2EL and throughputs from per-request timestamps
    workload.py    random-token prompts and lengths (vLLM's random dataset), copy prompts
    copy_text.py   the copy workload's text: an article to fix, from a seed
    presets.py     the standard workloads: throughput32, single, prefill512, copy
    systems.py     what a benchmarked system provides; inferd's offline API as one
    peers.py       llama-cpp-python and HF transformers on the same GGUF
    throughput.py  all requests at once          latency.py  one batch, repeated
    serve.py       HTTP streaming client          startup.py  process start → first token
    report.py      rich table, JSON, PNG plot
"""
