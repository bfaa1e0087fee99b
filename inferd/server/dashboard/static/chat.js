// The chat page: a conversation streamed from /v1/chat/completions (or a continuation from
// /v1/completions, for base models), the sampling controls, and under each reply its tokens,
// time to first token, tokens per second and the engine's timeline of the request.
"use strict";

(() => {
  const { el } = Inferd;
  const $ = (id) => document.getElementById(id);
  const conversation = []; // the messages sent so far (OpenAI's shape)
  let model = null;
  let controller = null; // the reply being streamed (Stop aborts it)
  let engineTimelines = false; // the server returns timelines (--enable-request-timeline)

  const EXAMPLES = {
    json: {
      prompt: "What is the capital of France? Answer as JSON.",
      extra: { response_format: { type: "json_schema", json_schema: { name: "capital", schema: {
        type: "object", properties: { city: { type: "string" }, country: { type: "string" } },
        required: ["city", "country"], additionalProperties: false } } } }, // prettier-ignore
    },
    tool: {
      prompt: "What is the weather in Paris?",
      extra: { tool_choice: "required", tools: [{ type: "function", function: {
        name: "get_weather", description: "The current weather in a city",
        parameters: { type: "object", properties: { city: { type: "string" } },
                      required: ["city"] } } }] }, // prettier-ignore
    },
  };

  async function init() {
    Inferd.wireKeyButton();
    $("send").addEventListener("click", send);
    $("stop").addEventListener("click", () => controller && controller.abort());
    $("reset").addEventListener("click", () => {
      conversation.length = 0;
      $("messages").replaceChildren();
    });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        send();
      }
    });
    for (const [name, example] of Object.entries(EXAMPLES)) {
      $("example-" + name).addEventListener("click", () => {
        $("prompt").value = example.prompt;
        $("extra").value = JSON.stringify(example.extra, null, 2);
        $("mode").value = "chat";
      });
    }
    $("example-clear").addEventListener("click", () => ($("extra").value = "{}"));
    try {
      const response = await Inferd.request("/v1/models");
      if (!response.ok) throw new Error(await Inferd.errorText(response));
      model = (await response.json()).data[0].id;
      $("model").textContent = model;
      // Whether replies may carry the engine's timeline ("return_timeline"): the server says so
      // in its dashboard data (a server without it answers 501: then they do not).
      const snapshot = await Inferd.request("/dashboard/snapshot");
      engineTimelines = snapshot.ok && (await snapshot.json()).server.request_timeline;
      Inferd.setStatus("live", "ready");
    } catch (e) {
      Inferd.setStatus("error", e.message);
    }
  }

  function sampling() {
    const number = (id) => ($(id).value === "" ? null : Number($(id).value));
    const fields = { temperature: number("temperature"), top_p: number("top_p"),
                     top_k: number("top_k"), max_tokens: number("max_tokens"),
                     seed: number("seed") }; // prettier-ignore
    return Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== null));
  }

  function extraFields() {
    const value = JSON.parse($("extra").value.trim() || "{}");
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new Error("more request fields must be a JSON object");
    }
    return value;
  }

  function addMessage(role, text) {
    const node = el("div", { class: "message " + role }, el("div", { class: "text" }, text));
    $("messages").append(node);
    node.scrollIntoView({ block: "end" });
    return node;
  }

  async function send() {
    const text = $("prompt").value;
    if (!text.trim() || controller || !model) return;
    let extra;
    try {
      extra = extraFields();
      $("extra-error").textContent = "";
    } catch (e) {
      $("extra-error").textContent = e.message;
      return;
    }
    const chat = $("mode").value === "chat";
    const body = Object.assign(sampling(), extra, { model, stream: true,
                               stream_options: { include_usage: true } }); // prettier-ignore
    if (engineTimelines) body.return_timeline = true;
    if (chat) {
      const system = $("system").value.trim();
      conversation.push({ role: "user", content: text });
      body.messages = (system ? [{ role: "system", content: system }] : []).concat(conversation);
    } else {
      body.prompt = text;
    }
    addMessage("user", text);
    $("prompt").value = "";
    const view = addMessage("assistant", "");
    view.dataset.state = "streaming";
    controller = new AbortController();
    $("send").disabled = true;
    $("stop").disabled = false;
    const reply = { text: "", calls: [], chunks: 0, sent: performance.now(), first: null,
                    last: null, usage: null, finish: null, timeline: null }; // prettier-ignore
    try {
      const response = await Inferd.request(chat ? "/v1/chat/completions" : "/v1/completions", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body), signal: controller.signal,
      });
      if (!response.ok) throw new Error(await Inferd.errorText(response));
      await Inferd.readEvents(response, (chunk) => receive(chunk, reply, view, chat));
      if (chat) {
        const message = { role: "assistant", content: reply.text };
        if (reply.calls.length) message.tool_calls = reply.calls;
        conversation.push(message);
      }
      view.dataset.state = "done";
      details(view, reply);
    } catch (e) {
      view.dataset.state = "error";
      view.classList.add("error");
      view.append(el("div", {}, e.name === "AbortError" ? "stopped" : "error: " + e.message));
      if (chat && conversation[conversation.length - 1].role === "user") conversation.pop();
    } finally {
      controller = null;
      $("send").disabled = false;
      $("stop").disabled = true;
    }
  }

  function receive(chunk, reply, view, chat) {
    if (chunk.error) throw new Error(chunk.error.message);
    if (chunk.usage) reply.usage = chunk.usage;
    if (chunk.timeline) reply.timeline = chunk.timeline[0];
    for (const choice of chunk.choices || []) {
      const delta = chat ? choice.delta || {} : { content: choice.text };
      const now = performance.now();
      if (delta.content || delta.tool_calls) {
        reply.first = reply.first || now;
        reply.last = now;
        reply.chunks += 1;
      }
      if (delta.content) {
        reply.text += delta.content;
        view.querySelector(".text").textContent = reply.text;
      }
      for (const call of delta.tool_calls || []) mergeCall(reply.calls, call);
      if (delta.tool_calls) showCalls(view, reply.calls);
      if (choice.finish_reason) reply.finish = choice.finish_reason;
    }
  }

  // Streamed tool calls come in pieces: the name first, then the arguments a fragment at a time.
  function mergeCall(calls, piece) {
    const call = (calls[piece.index] = calls[piece.index] ||
      { id: piece.id, type: "function", function: { name: "", arguments: "" } }); // prettier-ignore
    if (piece.id) call.id = piece.id;
    if (piece.function && piece.function.name) call.function.name += piece.function.name;
    if (piece.function && piece.function.arguments) call.function.arguments += piece.function.arguments;
  }

  function showCalls(view, calls) {
    let box = view.querySelector(".tool-calls");
    if (!box) view.append((box = el("div", { class: "tool-calls" })));
    box.textContent = calls.map((c) => `${c.function.name}(${c.function.arguments})`).join("\n");
  }

  // The panel under a reply: what the page measured, then the request's timeline: the engine's
  // when the server returns it, else as the page saw the stream.
  function details(view, reply) {
    const u = reply.usage || {};
    const tokens = u.completion_tokens;
    const seconds = reply.first !== null ? (reply.last - reply.first) / 1000 : 0;
    const rate = tokens > 1 && seconds > 0 ? ((tokens - 1) / seconds).toFixed(1) + " tok/s" : "n/a";
    const ttft = reply.first !== null ? Inferd.ms((reply.first - reply.sent) / 1000) : "n/a";
    const panel = el("details", { class: "stats", open: "" },
      el("summary", {}, `${tokens === undefined ? "?" : tokens} tokens · TTFT ${ttft} · ${rate}`),
      el("div", {}, `prompt ${u.prompt_tokens === undefined ? "?" : u.prompt_tokens} tokens` +
         ` · finish reason ${reply.finish || "n/a"} · ${reply.chunks} chunks` +
         " · TTFT and tok/s as this page received the stream")); // prettier-ignore
    const t = reply.timeline;
    if (t) {
      panel.append(el("div", { class: "timeline-note" },
        `engine: queued ${Inferd.ms(t.queue_s)} · prefill ${Inferd.ms(t.prefill_s)} · ` +
        `decode ${Inferd.ms(t.decode_s)} · end to end ${Inferd.ms(t.e2e_s)}` +
        (t.cached_prompt_tokens ? ` · ${t.cached_prompt_tokens} prompt tokens cached` : "") +
        (t.preemptions ? ` · preempted ${t.preemptions}×` : "")),
        Inferd.timelineBar(t.events, t.e2e_s || 0, t.e2e_s || 1)); // prettier-ignore
    } else if (reply.first !== null) {
      // As seen here: sent, first chunk, last chunk (the bar's "prefill" is the wait for it).
      const first = (reply.first - reply.sent) / 1000, end = (reply.last - reply.sent) / 1000;
      const events = [["arrived", 0], ["scheduled", 0], ["first_token", first], ["finished", end]];
      panel.append(el("div", { class: "timeline-note" }, "as this page saw it: waiting " +
        `${Inferd.ms(first)}, then streaming ${Inferd.ms(end - first)} (the engine's timeline ` +
        "needs a server started with --enable-request-timeline)"),
        Inferd.timelineBar(events, end, end || 1)); // prettier-ignore
    }
    view.append(panel);
  }

  init();
})();
