// The dashboard: one stream of engine snapshots (/dashboard/events), drawn as the KV cache's
// blocks, the scheduler's requests with their timelines, and charts of throughput, latency,
// step phases and memory, and the KV tiers where the server keeps some. Rates and recent means come from differences between snapshots the
// page keeps (the last five minutes); the engine keeps no history for it.
"use strict";

(() => {
  const { el } = Inferd;
  const HISTORY_S = 300; // what the charts show
  const RATE_WINDOW_S = 2; // a throughput point: tokens over (at least) this many seconds
  const PHASE_WINDOW_S = 10; // the step breakdown: steps of the last this many seconds
  const PHASES = ["schedule", "prepare", "forward", "sample", "output"];
  const PHASE_COLOURS = ["#a78bfa", "#f59e0b", "#2563eb", "#10b981", "#ef4444"];
  const BLOCK_COLOURS = { "-": "#4b5563", ".": "#e5e7eb", c: "#93c5fd" };
  const history = []; // {t, gen, prompt, hits, queries, steps}
  const latencies = new Map(); // request id → {at, ttft, tpot} of finished requests
  let updates = 0;

  function connect() {
    Inferd.setStatus("connecting", "connecting…");
    (async () => {
      const response = await Inferd.request("/dashboard/events?interval=0.5");
      if (!response.ok) throw new Error(await Inferd.errorText(response));
      Inferd.setStatus("live", "live");
      await Inferd.readEvents(response, (data) => {
        if (data.error) throw new Error(data.error.message);
        update(data);
      });
      throw new Error("the server ended the stream");
    })().catch((e) => {
      Inferd.setStatus("error", "disconnected: " + e.message + " (retrying)");
      setTimeout(connect, 2000);
    });
  }

  function update(data) {
    const c = data.counters;
    history.push({ t: data.monotonic_s, gen: c.generation_tokens, prompt: c.prompt_tokens,
                   hits: c.prefix_cache_hits, queries: c.prefix_cache_queries,
                   steps: data.steps, efficiency: (data.efficiency || {}).kinds }); // prettier-ignore
    while (history.length && history[0].t < data.monotonic_s - HISTORY_S) history.shift();
    for (const r of data.recent) {
      latencies.set(r.request_id, { at: r.finished_at, ttft: r.ttft_s, tpot: r.tpot_s });
    }
    for (const [id, p] of latencies) if (p.at < data.server_monotonic_s - HISTORY_S) latencies.delete(id);
    header(data.settings);
    kvCache(data);
    scheduler(data);
    recent(data);
    throughput(data);
    latency(data);
    phases(data);
    efficiency(data);
    memory(data.memory);
    kvTiers(data);
    updates += 1;
    document.body.dataset.updates = String(updates);
  }

  function header(s) {
    document.getElementById("model").textContent =
      `${s.model} · ${s.device} · ${s.dtype} · up to ${s.max_num_seqs} sequences, ` +
      `${s.max_num_batched_tokens} tokens a step, context ${s.max_model_len}`;
  }

  // ---- the KV cache ---------------------------------------------------------------------------
  function kvCache(data) {
    const box = document.getElementById("kv-groups");
    data.kv.forEach((group, i) => {
      let node = box.children[i];
      if (!node) {
        node = el("div", { class: "kv-group" }, el("h3"), el("p", { class: "counts" }),
                  el("canvas", { class: "blocks" })); // prettier-ignore
        box.append(node);
      }
      kvGroup(node, group, data.settings.block_size);
    });
    const last = history[history.length - 1], first = history[0];
    const hits = last.hits - first.hits, queries = last.queries - first.queries;
    const total = last.queries ? (100 * last.hits) / last.queries : 0;
    document.getElementById("kv-summary").textContent = data.settings.prefix_caching
      ? `prefix cache: ${total.toFixed(1)}% of prompt tokens found since start` +
        (queries ? `, ${((100 * hits) / queries).toFixed(1)}% over the last ` +
                   `${Math.round(last.t - first.t)} s` : "") // prettier-ignore
      : "prefix caching is off (--no-enable-prefix-caching)";
  }

  function kvGroup(node, group, blockSize) {
    const states = group.blocks;
    const count = (ch) => states.split(ch).length - 1;
    const used = count("u") + count("s"), cached = count("c"), free = count(".");
    Object.assign(node.dataset, { used, cached, free, shared: count("s") });
    node.querySelector("h3").textContent =
      (group.window === null ? "full attention" : `sliding window of ${group.window} tokens`) +
      ` · ${group.num_layers} layers · ${states.length - 1} blocks of ${blockSize} tokens ` +
      `(${Inferd.bytes(group.block_bytes)} each)`;
    node.querySelector(".counts").textContent =
      `in use ${used} (shared ${count("s")}) · cached for reuse ${cached} · free ${free}`;
    const owner = new Map();
    for (const [id, blocks] of Object.entries(group.owners)) for (const b of blocks) owner.set(b, id);
    drawBlocks(node.querySelector("canvas"), states, owner);
  }

  function drawBlocks(canvas, states, owner) {
    const width = canvas.clientWidth || 600;
    const cell = Math.max(3, Math.min(14, Math.floor(Math.sqrt((width * 120) / states.length))));
    const cols = Math.max(1, Math.floor(width / cell));
    canvas.style.height = Math.ceil(states.length / cols) * cell + "px";
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(Math.ceil(states.length / cols) * cell * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const gap = cell > 5 ? 1 : 0;
    for (let b = 0; b < states.length; b++) {
      const s = states[b];
      const x = (b % cols) * cell, y = Math.floor(b / cols) * cell;
      ctx.fillStyle = BLOCK_COLOURS[s] || Inferd.colour(owner.get(b) || "?");
      ctx.fillRect(x, y, cell - gap, cell - gap);
      if (s === "s" && cell >= 6) {
        ctx.fillStyle = "#fff";
        ctx.fillRect(x + cell / 2 - 1.5, y + cell / 2 - 1.5, 2, 2);
      }
    }
    canvas.onmousemove = (e) => {
      const b = Math.floor(e.offsetY / cell) * cols + Math.floor(e.offsetX / cell);
      const names = { "-": "null block", ".": "free", c: "cached for prefix reuse",
                      u: "in use by ", s: "shared, first holder " }; // prettier-ignore
      canvas.title = b < states.length ? `block ${b}: ${names[states[b]]}${owner.get(b) || ""}` : "";
    };
  }

  // ---- requests and their timelines -------------------------------------------------------------
  function scheduler(data) {
    document.getElementById("sched-summary").textContent =
      `${data.num_running} running · ${data.num_waiting} waiting` +
      (data.num_waiting > data.requests.length - data.num_running
        ? ` (the first ${data.requests.length - data.num_running} shown)` : ""); // prettier-ignore
    const scale = Math.max(1, ...data.requests.map((r) => r.age_s));
    const rows = data.requests.map((r) =>
      el("div", { class: "request-row", "data-request-id": r.request_id, "data-state": r.state },
        swatch(r.request_id), el("span", { class: "rid" }, r.request_id),
        el("span", { class: "badge state-" + r.state }, r.state),
        el("span", { class: "tokens" },
          `prompt ${r.prompt_tokens}` + (r.cached_prompt_tokens ? ` (${r.cached_prompt_tokens} cached)` : "") +
          (r.state === "prefill" ? ` · computed ${r.computed_tokens}` : "") +
          ` · out ${r.output_tokens}/${r.max_tokens}` + (r.num_samples > 1 ? ` ×${r.num_samples}` : "") +
          ` · ${r.blocks} blocks` + (r.preemptions ? ` · preempted ${r.preemptions}×` : "")),
        Inferd.timelineBar(r.events, r.age_s, scale))); // prettier-ignore
    document.getElementById("requests").replaceChildren(...(rows.length ? rows : [idle()]));
  }

  function swatch(id) {
    const node = el("span", { class: "swatch" });
    node.style.background = Inferd.colour(id);
    return node;
  }

  function idle() {
    return el("p", { class: "muted" }, "no request is running or waiting");
  }

  function recent(data) {
    const shown = data.recent.slice(-12).reverse();
    const scale = Math.max(0.001, ...shown.map((r) => r.e2e_s || 0));
    const rows = shown.map((r) =>
      el("div", { class: "request-row finished", "data-request-id": r.request_id },
        swatch(r.request_id), el("span", { class: "rid" }, r.request_id),
        el("span", { class: "badge" }, r.finish_reason),
        el("span", { class: "tokens" },
          `TTFT ${Inferd.ms(r.ttft_s)} · TPOT ${Inferd.ms(r.tpot_s)} · e2e ${Inferd.ms(r.e2e_s)} · ` +
          `${r.prompt_tokens} → ${r.generation_tokens} tokens` +
          (r.cached_prompt_tokens ? ` (${r.cached_prompt_tokens} cached)` : "") +
          (r.preemptions ? ` · preempted ${r.preemptions}×` : "")),
        Inferd.timelineBar(r.events, r.e2e_s || 0, scale))); // prettier-ignore
    const none = el("p", { class: "muted" }, "none since this page first connected");
    document.getElementById("recent").replaceChildren(...(rows.length ? rows : [none]));
  }

  // ---- charts ---------------------------------------------------------------------------------
  function throughput(data) {
    const now = data.monotonic_s;
    const gen = [], prompt = [];
    let j = 0;
    for (let i = 1; i < history.length; i++) {
      while (j + 1 < i && history[i].t - history[j + 1].t >= RATE_WINDOW_S) j += 1;
      const dt = history[i].t - history[j].t;
      if (dt <= 0) continue;
      gen.push([history[i].t - now, (history[i].gen - history[j].gen) / dt]);
      prompt.push([history[i].t - now, (history[i].prompt - history[j].prompt) / dt]);
    }
    Charts.lines(document.getElementById("throughput-chart"), {
      series: [{ name: "generated tok/s", colour: "#2563eb", points: gen },
               { name: "prompt tok/s", colour: "#f59e0b", points: prompt }], // prettier-ignore
      xMin: -HISTORY_S, xMax: 0, xLabel: "seconds ago", yLabel: "tokens/s",
      empty: "collecting…",
    });
  }

  function latency(data) {
    const now = data.server_monotonic_s;
    const ttft = [], tpot = [], lastMinute = { ttft: [], tpot: [] };
    for (const p of latencies.values()) {
      if (p.ttft !== null) ttft.push([p.at - now, p.ttft * 1000]);
      if (p.tpot !== null) tpot.push([p.at - now, p.tpot * 1000]);
      if (p.at > now - 60) {
        if (p.ttft !== null) lastMinute.ttft.push(p.ttft);
        if (p.tpot !== null) lastMinute.tpot.push(p.tpot);
      }
    }
    Charts.lines(document.getElementById("latency-chart"), {
      series: [{ name: "TTFT", colour: "#7c3aed", points: ttft, dots: true },
               { name: "TPOT", colour: "#059669", points: tpot, dots: true }], // prettier-ignore
      xMin: -HISTORY_S, xMax: 0, xLabel: "finished, seconds ago", yLabel: "ms",
      empty: "no request has finished since this page connected",
    });
    const median = (v) => (v.length ? v.slice().sort((a, b) => a - b)[Math.floor(v.length / 2)] : null);
    document.getElementById("latency-summary").textContent =
      `last minute: ${lastMinute.ttft.length} requests, median TTFT ` +
      `${Inferd.ms(median(lastMinute.ttft))}, median TPOT ${Inferd.ms(median(lastMinute.tpot))}`;
  }

  function phases(data) {
    const now = history[history.length - 1];
    let then = history.find((h) => h.t >= now.t - PHASE_WINDOW_S) || history[0];
    const window = (kind) => {
      const a = now.steps.find((s) => s.kind === kind), b = then.steps.find((s) => s.kind === kind);
      return { steps: a.steps - b.steps, seconds: a.seconds - b.seconds, tokens: a.tokens - b.tokens,
               phase: Object.fromEntries(PHASES.map((p) => [p, a.phase_seconds[p] - b.phase_seconds[p]])) };
    }; // prettier-ignore
    let kinds = ["decode", "prefill"].map((k) => [k, window(k)]);
    let span = `the last ${Math.round(now.t - then.t)} s`;
    if (!kinds.some(([, w]) => w.steps > 0)) {
      then = { steps: now.steps.map((s) => ({ ...s, steps: 0, seconds: 0, tokens: 0,
               phase_seconds: Object.fromEntries(PHASES.map((p) => [p, 0])) })) }; // prettier-ignore
      kinds = ["decode", "prefill"].map((k) => [k, window(k)]);
      span = "since start";
    }
    kinds = kinds.filter(([, w]) => w.steps > 0);
    Charts.stacked(document.getElementById("phase-chart"), {
      bars: kinds.map(([kind, w]) => ({
        label: kind,
        parts: PHASES.map((p, i) => ({ name: p, value: w.phase[p] / w.steps, colour: PHASE_COLOURS[i] })),
      })),
      format: (s) => Inferd.ms(s) + " a step",
    });
    document.getElementById("phase-summary").replaceChildren(
      el("span", {}, kinds.length ? `over ${span}: ` : "no step has run yet"),
      ...kinds.map(([kind, w]) => el("span", { class: "phase-line" },
        `${kind}: ${w.steps} steps, ${(w.tokens / w.steps).toFixed(1)} tokens a step, ` +
        `forward ${((100 * w.phase.forward) / w.seconds).toFixed(1)}%, outside the model ` +
        `${(100 - (100 * w.phase.forward) / w.seconds).toFixed(1)}%`))); // prettier-ignore
  }

  // MBU and MFU of the recent steps: the engine's cumulative counts differenced over the last
  // PHASE_WINDOW_S seconds (since start when no step ran in them); time-weighted like /metrics.
  function efficiency(data) {
    const e = data.efficiency || {};
    const panel = document.getElementById("efficiency-panel");
    panel.hidden = !e.kinds;
    if (!e.kinds) return;
    const now = history[history.length - 1];
    const since = (then) => ["decode", "prefill"].map((kind) => {
      const a = now.efficiency[kind], b = then && then.efficiency ? then.efficiency[kind] : null;
      const d = Object.fromEntries(Object.keys(a).map((f) => [f, a[f] - (b ? b[f] : 0)]));
      return [kind, d];
    }); // prettier-ignore
    let kinds = since(history.find((h) => h.t >= now.t - PHASE_WINDOW_S) || history[0]);
    let span = "over the last " + PHASE_WINDOW_S + " s";
    if (!kinds.some(([, d]) => d.steps > 0)) {
      kinds = since(null);
      span = "since start";
    }
    kinds = kinds.filter(([, d]) => d.steps > 0);
    const rate = (v, unit) => {
      const [scale, prefix] = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""]].find(([s]) => v >= s) || [1, ""];
      return (v / scale).toPrecision(3) + " " + prefix + unit;
    }; // prettier-ignore
    const rated = kinds.filter(([, d]) => d.rated_seconds > 0);
    Charts.stacked(document.getElementById("efficiency-chart"), {
      bars: rated.flatMap(([kind, d]) => [
        { label: kind + " MBU", parts: [{ name: "memory bandwidth", value: d.memory_seconds / d.rated_seconds, colour: "#2563eb" }] },
        { label: kind + " MFU", parts: [{ name: "matrix throughput", value: d.compute_seconds / d.rated_seconds, colour: "#f59e0b" }] },
      ]), // prettier-ignore
      format: (v) => (100 * v).toFixed(1) + "%",
      limit: 1,
      limitLabel: "the measured peak",
    });
    const lines = kinds.map(([kind, d]) => {
      let text = `${kind}: ${rate((d.weight_bytes + d.kv_bytes) / d.seconds, "B/s")} read, ` +
                 `${rate(d.flops / d.seconds, "FLOP/s")}`; // prettier-ignore
      if (d.rated_seconds > 0) {
        const bound = d.memory_seconds >= d.compute_seconds ? "memory-bound" : "compute-bound";
        text += `, MBU ${((100 * d.memory_seconds) / d.rated_seconds).toFixed(1)}%, ` +
                `MFU ${((100 * d.compute_seconds) / d.rated_seconds).toFixed(1)}% (${bound})`; // prettier-ignore
      }
      return el("span", { class: "phase-line" }, text);
    });
    const peaks = e.peaks
      ? `peaks: ${e.peaks.machine}, read bandwidth ${rate(e.peaks.memory_bandwidth_bytes_s, "B/s")}`
      : "MBU and MFU unknown: this machine's peaks are not measured yet (inferd plan or " +
        "inferd bench measures them once)"; // prettier-ignore
    document.getElementById("efficiency-summary").replaceChildren(
      el("span", {}, kinds.length ? `${span}: ` : "no step has run yet"), ...lines,
      el("span", { class: "phase-line", id: "efficiency-peaks" }, peaks)); // prettier-ignore
  }

  function memory(m) {
    const p = m.predicted;
    const measured = [{ name: "weights", value: m.weights, colour: "#2563eb" },
                      { name: "KV pool", value: m.kv_pool, colour: "#f59e0b" }]; // prettier-ignore
    let label = "RSS now", rows;
    if (m.device === "cuda") {
      label = "CUDA now";
      measured.push(
        { name: "other allocated", value: Math.max(0, m.cuda_allocated - m.weights - m.kv_pool), colour: "#10b981" },
        { name: "allocator cache", value: m.cuda_reserved - m.cuda_allocated, colour: "#9ca3af" },
        { name: "outside torch", value: Math.max(0, m.cuda_device_used - m.cuda_reserved), colour: "#4b5563" });
      rows = [["allocated", m.cuda_allocated], ["reserved", m.cuda_reserved],
              ["device in use", m.cuda_device_used], ["device memory", m.device_total]]; // prettier-ignore
    } else {
      // NOTE: the KV pool is allocated uninitialised: its pages count in RSS once written.
      measured.push({ name: "rest of RSS", value: Math.max(0, m.rss - m.weights - m.kv_pool), colour: "#9ca3af" });
      rows = [["resident set (RSS)", m.rss], ["of which anonymous", m.rss_anon],
              ["peak RSS", m.rss_peak], ["machine RAM", m.device_total]]; // prettier-ignore
    }
    const bars = [{ label, parts: measured }];
    if (p) {
      bars.push({ label: "predicted", parts: [
        { name: "weights", value: p.weights, colour: "#2563eb" },
        { name: "KV pool", value: p.kv_pool, colour: "#f59e0b" },
        { name: "activations (worst step)", value: p.activations, colour: "#10b981" },
        { name: "runtime", value: p.overhead, colour: "#d1d5db" }] }); // prettier-ignore
    }
    Charts.stacked(document.getElementById("memory-chart"), {
      bars, format: Inferd.bytes,
      limit: m.device === "cuda" ? m.device_total : null, limitLabel: "device memory",
    });
    rows = [["weights held", m.weights], ["KV pool", m.kv_pool], ...rows];
    if (p) rows.push(["predicted total", p.weights + p.kv_pool + p.activations + p.overhead]);
    document.getElementById("memory-table").replaceChildren(...rows.map(([name, value]) =>
      el("tr", {}, el("th", {}, name), el("td", {}, Inferd.bytes(value)))));
  }

  // ---- KV tiers (--kv-offload-memory, --kv-offload-dir): hidden on a server without them -------
  function kvTiers(data) {
    const tiers = data.kv_tiers || [];
    document.getElementById("tiers-panel").hidden = tiers.length === 0;
    if (!tiers.length) return;
    const share = (part, whole) => (whole ? ((100 * part) / whole).toFixed(1) + "%" : "n/a");
    const seconds = (s) => (s < 1 ? Inferd.ms(s) : s.toFixed(1) + " s");
    // NOTE: load_seconds covers reading and checking the blocks, so this is the rate a prompt
    // gets its blocks back at, not the raw speed of the medium.
    const speed = (t) => (t.load_seconds > 0 ? `, ${Inferd.bytes(t.bytes_read / t.load_seconds)}/s` : "");
    const rows = [
      ["hits (blocks)", (t) => t.hits],
      ["misses (blocks)", (t) => t.misses],
      ["hit rate", (t) => share(t.hits, t.hits + t.misses)],
      ["read", (t) => Inferd.bytes(t.bytes_read)],
      ["written", (t) => Inferd.bytes(t.bytes_written)],
      ["stored / capacity", (t) => `${Inferd.bytes(t.stored_bytes)} / ${Inferd.bytes(t.capacity_bytes)} ` +
                                   `(${share(t.stored_bytes, t.capacity_bytes)})`],
      ["load time", (t) => seconds(t.load_seconds) + speed(t)],
      ["write errors", (t) => t.write_errors, (t) => t.write_errors > 0],
      ["damaged (deleted, recomputed)", (t) => t.damaged, (t) => t.damaged > 0],
    ]; // prettier-ignore
    const head = el("tr", {}, el("th"), ...tiers.map((t) => el("th", { class: "tier-name" }, t.name)));
    document.getElementById("tiers-table").replaceChildren(head, ...rows.map(([name, value, bad]) =>
      el("tr", {}, el("th", {}, name), ...tiers.map((t) =>
        el("td", { "data-tier": t.name, class: bad && bad(t) ? "bad" : null }, value(t))))));
    const c = data.kv_connector || {};
    document.getElementById("tiers-summary").textContent =
      `since start: ${c.blocks_saved} blocks copied out for the tiers (${c.saves_dropped} dropped: ` +
      `the tiers fell behind), ${c.blocks_loaded} loaded into the pool, ${c.lookups_late} ` +
      `lookups too late (recomputed)`;
  }

  Inferd.wireKeyButton();
  connect();
})();
