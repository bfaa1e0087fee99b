// What both pages share: the API key (asked for when the server answers 401, kept for this tab
// only), fetch with the key, reading server-sent events from a fetch (EventSource cannot send
// an Authorization header), DOM building without innerHTML (text from the server or the model
// is always set as text, never parsed as HTML), and number formatting.
"use strict";

const Inferd = (() => {
  const KEY_ITEM = "inferd.apiKey";
  let asking = null; // the pending key prompt, shared by every request that met a 401

  function apiKey() {
    return sessionStorage.getItem(KEY_ITEM) || "";
  }

  function withKey(headers) {
    const out = Object.assign({}, headers || {});
    const key = apiKey();
    if (key) out.Authorization = "Bearer " + key;
    return out;
  }

  // Show the key dialog (each page has one: #key-dialog) and resolve once a key is entered.
  function askKey(message) {
    if (asking) return asking;
    const dialog = document.getElementById("key-dialog");
    const input = document.getElementById("key-input");
    const note = document.getElementById("key-message");
    note.textContent = message;
    input.value = "";
    // NOTE: Escape would close the dialog and leave the page waiting for a key forever.
    dialog.oncancel = (e) => e.preventDefault();
    asking = new Promise((resolve) => {
      const done = () => {
        sessionStorage.setItem(KEY_ITEM, input.value.trim());
        dialog.close();
        document.getElementById("key-ok").removeEventListener("click", done);
        input.removeEventListener("keydown", enter);
        asking = null;
        resolve();
      };
      const enter = (e) => {
        if (e.key === "Enter") {
          e.preventDefault();
          done();
        }
      };
      document.getElementById("key-ok").addEventListener("click", done);
      input.addEventListener("keydown", enter);
    });
    dialog.showModal();
    input.focus();
    return asking;
  }

  function keyMessage() {
    return apiKey()
      ? "The server refused this API key: enter the key it was started with (--api-key)."
      : "This server needs an API key (inferd serve --api-key): enter it to continue.";
  }

  // fetch() with the key; on 401 ask for the key and try again.
  async function request(path, options) {
    for (;;) {
      const opts = Object.assign({}, options || {});
      opts.headers = withKey(opts.headers);
      const response = await fetch(path, opts);
      if (response.status !== 401) return response;
      await askKey(keyMessage());
    }
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || JSON.stringify(body);
    } catch (e) {
      return response.status + " " + response.statusText;
    }
  }

  // Read a text/event-stream response: onData(parsed JSON) per `data:` line ("[DONE]" ends).
  async function readEvents(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          onData(JSON.parse(data));
        }
      }
    }
  }

  // el("div", {class: "x", "data-id": 3}, child, "text", ...): an element; text stays text.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "n/a";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
  }

  function ms(seconds) {
    if (seconds === null || seconds === undefined) return "n/a";
    const v = seconds * 1000;
    return (v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0)) + " ms";
  }

  // A stable colour per request id, so a request keeps its colour on every panel and update.
  function colour(id) {
    let h = 0;
    for (let i = 0; i < id.length; i++) h = (h * 31 + id.charCodeAt(i)) >>> 0;
    return "hsl(" + (h % 360) + ", 65%, 50%)";
  }

  // A request's life as a bar of segments, from its timeline events ([name, t] or {event, t},
  // seconds since arrival; inferd/outputs.py RequestMetrics.timeline): queued until scheduled,
  // prefill until the first token, decode until finished (or `end`), a mark per preemption.
  // `scale`: the seconds the bar's width stands for (shared by the rows of one list).
  function timelineBar(events, end, scale) {
    const at = {};
    const preempted = [];
    for (const e of events) {
      const [name, t] = Array.isArray(e) ? e : [e.event, e.t];
      if (name === "preempted") preempted.push(t);
      else at[name] = t;
    }
    const stop = at.finished !== undefined ? at.finished : end;
    const spans = [["queued", 0, at.scheduled !== undefined ? at.scheduled : stop]];
    if (at.scheduled !== undefined) {
      spans.push(["prefill", at.scheduled, at.first_token !== undefined ? at.first_token : stop]);
    }
    if (at.first_token !== undefined) spans.push(["decode", at.first_token, stop]);
    const node = el("div", { class: "bar" });
    for (const [name, a, b] of spans) {
      const seg = el("div", { class: "seg seg-" + name, title: `${name} ${ms(b - a)}` });
      seg.style.left = (100 * a) / scale + "%";
      seg.style.width = Math.max((100 * (b - a)) / scale, 0.3) + "%";
      node.append(seg);
    }
    for (const t of preempted) {
      const mark = el("div", { class: "seg seg-preempted", title: `preempted at ${ms(t)}` });
      mark.style.left = (100 * t) / scale + "%";
      node.append(mark);
    }
    return node;
  }

  function setStatus(state, text) {
    const node = document.getElementById("status");
    node.dataset.state = state;
    node.textContent = text;
  }

  function wireKeyButton() {
    document.getElementById("key-button").addEventListener("click", () => {
      askKey("Enter the API key to send with every request (empty: none).").then(() =>
        window.location.reload(),
      );
    });
  }

  return { apiKey, request, errorText, readEvents, el, bytes, ms, colour, timelineBar,
           setStatus, wireKeyButton }; // prettier-ignore
})();
