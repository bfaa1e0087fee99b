// Two small chart kinds drawn on <canvas>, enough for the dashboard: lines (or points) over
// time, and horizontal stacked bars. No library: a few axes, ticks and a legend.
"use strict";

const Charts = (() => {
  const AXIS = "#6b7280";
  const GRID = "#e5e7eb";
  const FONT = "11px system-ui, sans-serif";

  // Size the canvas' backing store to its CSS box (sharp on high-DPI screens).
  function context(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 400;
    const height = canvas.clientHeight || 180;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = FONT;
    return { ctx, width, height };
  }

  // Round tick values covering [lo, hi].
  function ticks(lo, hi, count) {
    const span = hi - lo || 1;
    const raw = span / count;
    const step = [1, 2, 5, 10].map((m) => m * 10 ** Math.floor(Math.log10(raw))).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function label(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100 || a === 0) return v.toFixed(0);
    return a >= 10 ? v.toFixed(1) : v.toFixed(2);
  }

  // series: [{name, colour, points: [[x, y], ...], dots: bool}]; x in [xMin, xMax].
  function lines(canvas, { series, xMin, xMax, xLabel, yLabel, empty }) {
    const { ctx, width, height } = context(canvas);
    const left = 46, right = 8, top = 18, bottom = 28;
    const all = series.flatMap((s) => s.points);
    if (!all.length) {
      ctx.fillStyle = AXIS;
      ctx.fillText(empty || "no data yet", left, height / 2);
      return;
    }
    const yMax = Math.max(...all.map((p) => p[1]), 1e-9) * 1.1;
    const x = (v) => left + ((v - xMin) / (xMax - xMin || 1)) * (width - left - right);
    const y = (v) => height - bottom - (v / yMax) * (height - top - bottom);
    ctx.strokeStyle = GRID;
    ctx.fillStyle = AXIS;
    ctx.textAlign = "right";
    for (const t of ticks(0, yMax, 4)) {
      ctx.beginPath();
      ctx.moveTo(left, y(t));
      ctx.lineTo(width - right, y(t));
      ctx.stroke();
      ctx.fillText(label(t), left - 4, y(t) + 4);
    }
    ctx.textAlign = "center";
    for (const t of ticks(xMin, xMax, 6)) ctx.fillText(label(t), x(t), height - bottom + 14);
    ctx.fillText(xLabel, (left + width - right) / 2, height - 2);
    ctx.textAlign = "left";
    ctx.fillText(yLabel, 2, 11);
    let legendX = left + 8 + ctx.measureText(yLabel).width + 40;
    for (const s of series) {
      ctx.strokeStyle = ctx.fillStyle = s.colour;
      ctx.lineWidth = 1.5;
      if (s.dots) {
        for (const [px, py] of s.points) ctx.fillRect(x(px) - 2, y(py) - 2, 4, 4);
      } else {
        ctx.beginPath();
        s.points.forEach(([px, py], i) => (i ? ctx.lineTo(x(px), y(py)) : ctx.moveTo(x(px), y(py))));
        ctx.stroke();
      }
      ctx.fillRect(legendX, 5, 10, 8);
      ctx.fillStyle = AXIS;
      ctx.fillText(s.name, legendX + 14, 13);
      legendX += 24 + ctx.measureText(s.name).width;
    }
    ctx.lineWidth = 1;
  }

  // bars: [{label, parts: [{name, value, colour}]}], one stacked horizontal bar each, on one
  // scale (up to `limit` when given, drawn as a dashed line named `limitLabel`).
  function stacked(canvas, { bars, format, limit, limitLabel }) {
    const { ctx, width, height } = context(canvas);
    const left = 92, right = 12, legend = 40;
    const rowHeight = Math.min(34, (height - legend - 8) / Math.max(bars.length, 1));
    const totals = bars.map((b) => b.parts.reduce((sum, p) => sum + p.value, 0));
    const scale = Math.max(...totals, limit || 0, 1e-12);
    const w = (v) => (v / scale) * (width - left - right);
    const names = new Map();
    bars.forEach((bar, i) => {
      const top = 4 + i * rowHeight;
      ctx.fillStyle = AXIS;
      ctx.textAlign = "right";
      ctx.fillText(bar.label, left - 6, top + rowHeight / 2 + 4);
      let at = left;
      for (const part of bar.parts) {
        ctx.fillStyle = part.colour;
        ctx.fillRect(at, top + 3, Math.max(w(part.value), 0), rowHeight - 8);
        at += w(part.value);
        names.set(part.name, part.colour);
      }
      ctx.fillStyle = AXIS;
      ctx.textAlign = "left";
      const text = format(totals[i]);
      const inside = at + ctx.measureText(text).width + 6 > width;
      ctx.fillStyle = inside ? "#fff" : AXIS;
      ctx.fillText(text, inside ? at - ctx.measureText(text).width - 4 : at + 4, top + rowHeight / 2 + 4);
    });
    if (limit) {
      ctx.strokeStyle = "#dc2626";
      ctx.setLineDash([4, 3]);
      ctx.beginPath();
      ctx.moveTo(left + w(limit), 2);
      ctx.lineTo(left + w(limit), 4 + bars.length * rowHeight);
      ctx.stroke();
      ctx.setLineDash([]);
      names.set(limitLabel, "#dc2626");
    }
    // The legend: as many lines as it needs, under the bars.
    let x = left, y = height - legend + 12;
    ctx.textAlign = "left";
    for (const [name, colour] of names) {
      const size = ctx.measureText(name).width + 24;
      if (x + size > width && x > left) {
        x = left;
        y += 14;
      }
      ctx.fillStyle = colour;
      ctx.fillRect(x, y - 8, 10, 8);
      ctx.fillStyle = AXIS;
      ctx.fillText(name, x + 14, y);
      x += size;
    }
  }

  return { lines, stacked };
})();
