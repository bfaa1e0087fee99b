"""The tables `inferd memory` prints (rich): parameters (total vs active for a Mixture of
Experts), weights by precision, what a decode step reads, KV cache and what each KV dtype holds,
activations, the per-device total, capacity, and with `--measure` the measured memory over the
run. Plain text cells."""

from __future__ import annotations


def _bin(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,} B"


def _gb(n: int) -> tuple[str, str]:
    return f"{n / 1e9:,.3f}", f"{n / 2**30:,.3f}"


def _print(console, title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """One table; the middle columns are figures (right-aligned). Cells are plain text."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", title_style="bold")
    for i, col in enumerate(columns):
        table.add_column(col, justify="right" if 0 < i < len(columns) - 1 else "left")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


def render(console, est, checkpoint, source: str, measured, kv_dtypes=()) -> None:
    """`kv_dtypes`: memory/kv_dtypes.py's rows (none: no such table)."""
    from rich.text import Text

    cfg, p, dev, ck = checkpoint.config, est.params, est.per_device, est.checkpoint
    tp, layers, acts = est.tensor_parallel_size, cfg.num_layers, dev.activations
    console.print(Text(f"{est.name} ({checkpoint.format}: {checkpoint.path})", style="bold"))
    console.print(
        f"plan: {est.device}, weights {est.weight_plan.scheme}, KV cache {est.kv_cache_dtype}, "
        f"C={est.concurrency} requests × L={est.max_model_len} tokens, step budget "
        f"{est.max_num_batched_tokens} tokens, TP={tp}, {est.attention_backend} attention",
        markup=False,
    )
    # fmt: off
    kv_heads = f"{cfg.num_kv_heads} KV head" + "s" * (cfg.num_kv_heads != 1)
    heads = f"{cfg.num_heads} q heads, {kv_heads} of {cfg.head_dim}"
    extras = " + q/k/v biases" * cfg.attention_bias + " + q/k norms" * cfg.qk_norm
    tied = "tied to the embedding: counted once" if cfg.tie_word_embeddings else "vocab × hidden"
    rows = [
        ("embedding", f"{p.embedding:,}", f"vocab {cfg.vocab_size} × hidden {cfg.hidden_size}"),
        ("attention", f"{p.attention:,}", f"{layers} layers × q/k/v/o ({heads}){extras}"),
        ("MLP", f"{p.mlp:,}", _mlp_how(cfg)),
        ("norms", f"{p.layer_norms + p.final_norm:,}",
         f"{p.layer_norms // layers // cfg.hidden_size} per layer + the final norm"),
        ("LM head", f"{p.lm_head:,}", tied),
        ("total (from config)", f"{p.total:,}", ""),
        *_expert_rows(cfg, p),
        (f"total ({ck.format} tensors)", f"{ck.num_params:,}",
         "matches the config" if ck.num_params == p.total else "DIFFERS from the config")
        if ck else ("checkpoint tensors", "-", "config only: no weight files"),
    ]
    if tp > 1:
        split = "heads, MLP and vocabulary split" + (
            f"; experts {cfg.moe.num_experts // tp} per device (expert parallel)"
            if cfg.moe else "")
        rows.append((f"per device (TP={tp})", f"{est.params_per_device:,}",
                     f"{split}; norms replicated"))
    _print(console, "Parameters", ("part", "count", "how"), rows)

    plan = est.weight_plan
    in_use = "" if plan.blocks else est.dtype
    rows = [("bf16/fp16" if prec == "bf16" else prec, *_gb(n),
             "<- in use" if in_use and in_use in (prec, "fp16" if prec == "bf16" else "") else "")
            for prec, n in est.weights_by_precision.items() if prec != "fp16"]
    if plan.blocks:
        rows.append((f"{plan.scheme} (the default)", *_gb(plan.total), "<- in use: "
                     f"{plan.note}: {_bin(plan.held)}"))
    if ck is not None:
        shares = sorted(ck.by_type.items(), key=lambda kv: -kv[1][0])
        types = ", ".join(f"{k} {v[0] / ck.stored_params:.0%}" for k, v in shares)
        rows.append((f"on disk ({ck.format})", *_gb(ck.data_bytes), f"{types}; "
                     f"{ck.bits_per_weight:.2f} bits/weight; files {_bin(ck.file_bytes)}"))
    if tp > 1:
        rows.append((f"per device ({est.dtype})", *_gb(dev.weights), f"TP={tp}"))
    _print(console, "Weights", ("precision", "GB", "GiB", "note"), rows)
    if plan.blocks:
        _print_loading(console, plan, dev.overhead.bytes)

    _print_decode_reads(console, est, cfg)

    row = est.kv_bytes_per_token_per_layer // (2 * cfg.num_kv_heads)  # one head's K (or V)
    kvb, extra = divmod(row, cfg.head_dim)  # bytes per value; int8: + its row's scale
    row_how = f"{cfg.head_dim} × {kvb} B" + (f" + a {extra} B scale" if extra else "")
    sliding = sum(cfg.layer_window(i) is not None for i in range(layers))
    rows = [
        ("per token, one layer", _bin(est.kv_bytes_per_token_per_layer),
         f"2 (K and V) × {kv_heads} × ({row_how})" if extra else
         f"2 (K and V) × {kv_heads} × {row_how}"),
        ("per token, all layers", _bin(est.kv_bytes_per_token),
         f"× {layers} layers (as if none had a window)"),
    ]
    if tp > 1:
        rows.append(("per token, per device", _bin(est.kv_bytes_per_token_per_device),
                     f"KV heads split over {tp} devices, or replicated when fewer"))
    rows.append((f"one request of {est.max_model_len} tokens", _bin(est.kv_bytes_per_request),
                 f"{sliding} sliding layers hold at most {cfg.sliding_window} tokens"
                 if sliding else "no sliding-window layers"))
    if sliding:
        rows.append(("  same without the window cap", _bin(est.kv_bytes_per_request_uncapped),
                     f"{est.max_model_len} tokens in every layer"))
    rows += [
        (f"C={est.concurrency} requests (formula)", _bin(dev.kv_formula), "C × one request"),
        ("engine KV pool for them", _bin(dev.kv_cache),
         f"{dev.kv_pool.num_blocks} blocks of {est.block_size} tokens per layer group: whole "
         "blocks and a null block" + (", and a window + step reserve per sequence in the "
                                      "sliding layers" if sliding else "")),
    ]
    _print(console, f"KV cache ({est.kv_cache_dtype})", ("what", "bytes", "how"), rows)
    if kv_dtypes:
        _print_kv_dtypes(console, est, kv_dtypes)

    rows = [(f"{t.name} ({t.phase})", _bin(t.bytes), t.why) for t in acts.terms]
    rows.append(("peak", _bin(acts.peak_bytes),
                 f"residual stream + the largest phase ({acts.peak_phase}); layers run in turn"))
    _print(console, f"Activations and temporaries (one step of {est.max_num_batched_tokens} "
           "tokens)", ("term", "bytes", "why"), rows)

    left = est.device_memory - dev.total
    _print(console, f"Per device ({est.device}, TP={tp})", ("part", "bytes", "note"), [
        ("weights", _bin(dev.weights), f"{plan.scheme}: " + (
            "the checkpoint's blocks" if plan.stored else "GGUF blocks") if plan.blocks
         else f"{est.params_per_device:,} × {est.dtype}"),
        ("KV cache", _bin(dev.kv_cache), "the engine's pool above"),
        ("activations", _bin(acts.peak_bytes), "peak of a step"),
        ("runtime overhead", _bin(dev.overhead.bytes), dev.overhead.why),
        ("total", _bin(dev.total), ""),
        ("device memory", _bin(est.device_memory),
         f"{source}: " + (f"fits, {_bin(left)} left" if est.fits else
                          f"does NOT fit, {_bin(-left)} short")),
    ])
    limit = " (the model's limit)" if est.max_context == cfg.max_position_embeddings else ""
    _print(console, f"Capacity on {_bin(est.device_memory)} per device",
           ("question", "answer"), [
        (f"most requests of {est.max_model_len} tokens", f"{est.max_concurrency:,}"),
        (f"longest context for {est.concurrency} requests", f"{est.max_context:,}{limit}"),
        ("smallest tensor-parallel size that fits", str(est.min_tensor_parallel_size or "none")),
    ])
    if measured is not None:
        print_snapshots(console, measured)
        _print(console, f"Measured on {measured.device}: {measured.prompt_tokens} prompt "
               f"tokens, {measured.generated_tokens} generated",
               ("what", "predicted", "measured", "why"),
               [(what, _bin(pred), _bin(got), why) for what, pred, got, why in measured.rows])
    # fmt: on


def _print_loading(console, plan, overhead: int) -> None:
    """What loading a GGUF file's blocks takes (loader/gguf_cache.py): a first load packs them
    a layer at a time into the weight cache's entry, a cached one maps that entry."""
    unpacking = _bin(plan.unpacking)
    if plan.stored:  # an HF checkpoint's quantised layers: repacked in memory at every start
        rows = [("every load", _bin(overhead + plan.held + plan.unpacking),
                 "runtime + the checkpoint's layers repacked as blocks, a range of rows at a "
                 f"time ({unpacking} unpacked at once), written to the weight cache (not for "
                 "GPTQ act-order or FP8), which later starts map")]  # fmt: skip
        _print(console, "Loading (resident memory, with the runtime)", ("load", "bytes", "how"),
               rows)  # fmt: skip
        return
    rows = [
        ("first", _bin(overhead + plan.held + plan.unpacking),
         "runtime + the blocks, packed a layer at a time and written to the weight cache "
         f"(mapped back as written) + one range of rows being unpacked ({unpacking})"),
        ("cached", _bin(overhead + plan.held), "runtime + the cache entry, mapped"),
        ("weight cache entry", _bin(plan.held), "on disk (`inferd cache`; --weight-cache-size)"),
    ]  # fmt: skip
    _print(console, "Loading (resident memory, with the runtime)", ("load", "bytes", "how"), rows)


def _print_kv_dtypes(console, est, rows) -> None:
    """Contexts × concurrency by KV dtype: what switching --kv-cache-dtype buys."""
    where = f"{_bin(est.device_memory)}" + (f" per device (TP={est.tensor_parallel_size})"
                                            if est.tensor_parallel_size > 1 else "")  # fmt: skip
    table = [(r.kv_dtype, f"{r.bytes_per_token:,}", f"{r.contexts_4k_per_gib:,}",
              f"{r.max_concurrency:,}" if r.max_concurrency is not None else "-",
              "<- in use" if r.kv_dtype == est.kv_cache_dtype else
              "" if r.runs_here else f"not on {est.device}")
             for r in rows]  # fmt: skip
    _print(console, "KV dtypes: contexts × concurrency",
           ("KV dtype", "bytes/token", "4k-token contexts per 1 GiB",
            f"requests of {est.max_model_len} tokens in {where}", "note"), table)  # fmt: skip


def _mlp_how(cfg) -> str:
    h, moe = cfg.hidden_size, cfg.moe
    dense = f"3 × {h} × {cfg.intermediate_size} (gate, up, down)"
    if moe is None:
        return f"{cfg.num_layers} layers × {dense}"
    sparse = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    how = (
        f"{sparse} MoE layers × (router {moe.num_experts} × {h} + {moe.num_experts} experts "
        f"× 3 × {h} × {moe.intermediate_size}"
    )
    if moe.shared_intermediate_size:
        how += f" + shared expert 3 × {h} × {moe.shared_intermediate_size}"
    how += ")"
    if sparse < cfg.num_layers:
        how += f" + {cfg.num_layers - sparse} dense layers × {dense}"
    return how


def _expert_rows(cfg, p) -> list[tuple[str, str, str]]:
    """Total vs active parameters of a Mixture of Experts."""
    moe = cfg.moe
    if moe is None:
        return []
    share = f"{moe.top_k} of {moe.num_experts} experts per layer"
    return [
        ("  of which routed experts", f"{p.experts:,}", f"{p.experts / p.total:.0%} of the model"),
        (
            "active per token",
            f"{p.active:,}",
            f"all but the experts a token is not routed to "
            f"({share}): {p.active / p.total:.1%} of the total",
        ),
    ]


def _print_decode_reads(console, est, cfg) -> None:
    """Decode is bound by reading weights: what one decode step reads, per device."""
    moe = cfg.moe
    rows = []
    for batch, nbytes in est.decode_read_bytes.items():
        if moe is None:
            how = "every weight once (one embedding row per sequence)"
        else:
            hit = moe.num_experts * (1 - (1 - moe.top_k / moe.num_experts) ** batch)
            how = (
                f"all but the experts no sequence uses: ~{hit:.1f} of {moe.num_experts} "
                f"experts per layer if routing is even (E(1 - (1 - k/E)^{batch}))"
            )
        rows.append((f"{batch} sequence" + "s" * (batch != 1), _bin(nbytes), how))
    _print(
        console,
        "Decode: weights read per step, per device (memory bandwidth bound)",
        ("step of", "bytes", "why"),
        rows,
    )


def print_snapshots(console, measured) -> None:
    """The mini-project's table: memory before loading, after loading, after a generation, and
    the peak, as the process (CPU) or PyTorch's caching allocator (CUDA) saw it."""
    snaps = [*measured.snapshots, *([measured.peak] if measured.peak else [])]
    if measured.device == "cuda":
        columns = ("when", "allocated", "reserved", "device in use", "note")
        fields = ("cuda_allocated", "cuda_reserved", "cuda_device_used")
        note = "allocated: live tensors; reserved: held by PyTorch's caching allocator"
    else:
        columns = ("when", "RSS", "anonymous RSS", "heap in use", "heap held", "note")
        fields = ("rss", "rss_anon", "heap_in_use", "heap_held")
        note = "heap: glibc malloc, which PyTorch's CPU tensors come from"
    rows = [(s.label, *(_bin(getattr(s, f)) for f in fields), note if i == 0 else "")
            for i, s in enumerate(snaps)]  # fmt: skip
    _print(console, f"Memory over the run ({measured.device})", columns, rows)
