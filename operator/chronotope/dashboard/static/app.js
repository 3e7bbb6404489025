// Chronotope dashboard: polls /api/state and redraws. Every user-supplied string is set
// with textContent or as an SVG text node, never as HTML.
"use strict";

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function heat(percent) {  // free: pale green; shared: amber; whole: red
  if (percent <= 0) return "#e6f4ea";
  if (percent < 100) return "hsl(" + (45 - percent * 0.3) + ", 90%, " + (75 - percent * 0.2) + "%)";
  return "#d9534f";
}

function drawMap(state) {
  const map = document.getElementById("gpumap");
  map.replaceChildren();
  for (const node of state.nodes) {
    const row = el("div", { class: "node", "data-node": node.node });
    row.append(el("span", { class: "name" }, node.node), el("span", { class: "type" }, node.gpuType));
    for (const gpu of node.gpus) {
      const used = gpu.holders.reduce((s, h) => s + h.percent, 0);
      const holders = gpu.holders.map((h) => h.pod + " (" + h.percent + "%)").join(", ");
      const cell = el("span", {
        class: "gpu",
        "data-gpu": node.node + "/" + gpu.index,
        "data-holders": gpu.holders.map((h) => h.pod).join(","),
        title: "GPU " + gpu.index + ": " + (holders || "free"),
      });
      cell.style.background = heat(Math.min(used, 100));
      row.append(cell);
    }
    map.append(row);
  }
  const totals = document.getElementById("totals");
  totals.replaceChildren();
  for (const [type, t] of Object.entries(state.totals)) {
    totals.append(el("div", {}, type + ": " + t.free + " free, " + t.shared + " shared, " + t.whole + " whole"));
  }
}

function drawGantt(state) {
  const g = document.getElementById("gantt");
  g.replaceChildren();
  const now = Date.parse(state.now);
  const jobs = state.jobs.map((j) => ({
    ...j,
    s: j.start ? Date.parse(j.start) : now,
    f: j.finish ? Date.parse(j.finish) : now,
    d: j.deadline ? Date.parse(j.deadline) : null,
  }));
  let lo = now, hi = now + 60000;
  for (const j of jobs) { lo = Math.min(lo, j.s); hi = Math.max(hi, j.f); }
  // deadlines soon after the last finish widen the chart; far ones are marked at the edge
  const reach = hi + (hi - lo) / 2;
  for (const j of jobs) if (j.d !== null && j.d <= reach) hi = Math.max(hi, j.d);
  const left = 260, width = 660, rowH = 18;
  const x = (t) => left + ((t - lo) / Math.max(hi - lo, 1)) * width;
  const groups = {};
  for (const j of jobs) (groups[j.gpuType || "(waiting)"] = groups[j.gpuType || "(waiting)"] || []).push(j);
  let y = 14;
  for (const type of Object.keys(groups).sort()) {
    g.append(svg("text", { x: 4, y: y, "font-weight": "bold" }, type));
    y += rowH;
    for (const j of groups[type]) {
      g.append(svg("text", { x: 14, y: y }, j.key + " · " + j.phase));
      const bar = svg("rect", {
        x: x(j.s), y: y - 11, height: 12, width: Math.max(x(j.f) - x(j.s), 2),
        fill: j.gpuType ? "#4a90d9" : "#bbb",
        "data-job": j.key, "data-gpu-type": j.gpuType || "",
      });
      bar.append(svg("title", {}, j.key + ": " + (j.gpuType || "waiting") + " until " + (j.finish || "?")));
      g.append(bar);
      if (j.d !== null && j.d >= lo && j.d <= hi) {
        g.append(svg("line", { x1: x(j.d), x2: x(j.d), y1: y - 13, y2: y + 3, stroke: "#d00", "stroke-width": 2 }));
      } else if (j.d !== null && j.d > hi) {
        const later = svg("text", { x: left + width + 4, y: y, fill: "#d00" }, "›");
        later.append(svg("title", {}, "deadline " + j.deadline));
        g.append(later);
      }
      y += rowH;
    }
  }
  g.append(svg("line", { x1: x(now), x2: x(now), y1: 0, y2: y, stroke: "#000", "stroke-dasharray": "3,3" }));
  g.setAttribute("height", Math.max(y, 40));
}

// Predicted (dashed) and observed P99 over time from status.p99History, the SLO as a
// horizontal red line. Points without an observation break the observed line.
function drawP99(p) {
  const w = 240, h = 64, pad = 4;
  const chart = svg("svg", { class: "p99", width: w, height: h, "data-pipeline": p.key });
  const points = (p.p99History || []).map((q) => ({
    t: Date.parse(q.time), predicted: q.predictedMs ?? null, observed: q.observedMs ?? null,
  })).filter((q) => !Number.isNaN(q.t));
  if (!points.length) {
    chart.append(svg("text", { x: pad, y: h / 2 }, "no history"));
    return chart;
  }
  const values = points.flatMap((q) => [q.predicted, q.observed]).filter((v) => v !== null);
  const top = Math.max(...values, p.sloMs ?? 0, 1) * 1.1;
  const t0 = points[0].t, t1 = points[points.length - 1].t;
  const x = (t) => pad + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (w - 2 * pad);
  const y = (v) => h - pad - (v / top) * (h - 2 * pad);
  const minutes = Math.round((t1 - t0) / 60000);
  chart.append(svg("text", { x: pad, y: 11 }, Math.round(top) + " ms · " + minutes + " min"));
  if (p.sloMs !== null && p.sloMs !== undefined) {
    const slo = svg("line", {
      x1: pad, x2: w - pad, y1: y(p.sloMs), y2: y(p.sloMs),
      stroke: "#d00", "stroke-width": 1, "data-series": "slo",
    });
    slo.append(svg("title", {}, "SLO " + p.sloMs + " ms"));
    chart.append(slo);
  }
  const series = [["predicted", "#4a90d9", "4,2"], ["observed", "#e67e22", ""]];
  for (const [name, colour, dash] of series) {
    let run = [];
    const flush = () => {
      if (run.length) {
        const line = svg("polyline", {
          points: run.join(" "), fill: "none", stroke: colour, "stroke-width": 1.5,
          "stroke-dasharray": dash, "data-series": name,
        });
        line.append(svg("title", {}, name + " P99 (ms)"));
        chart.append(line);
      }
      run = [];
    };
    for (const q of points) {
      if (q[name] === null) flush();
      else run.push(x(q.t).toFixed(1) + "," + y(q[name]).toFixed(1));
    }
    flush();
    const last = [...points].reverse().find((q) => q[name] !== null);
    if (last) {
      const dot = svg("circle", { cx: x(last.t), cy: y(last[name]), r: 2, fill: colour, "data-series": name });
      dot.append(svg("title", {}, name + " " + last[name] + " ms at " + new Date(last.t).toLocaleTimeString()));
      chart.append(dot);
    }
  }
  return chart;
}

function drawQuota(q) {
  // one bar per GPU type: used within the nominal quota, borrowed above it, lent to others,
  // the rest of the quota idle; without Queues (quotas off), the GPUs in use as text
  if (!q.gpus.length) return document.createTextNode(q.inUse + " GPU(s) in use (no Queue: quotas off)");
  const rowH = 16, labelW = 150, barW = 240, width = labelW + barW + 170;
  const chart = svg("svg", { width: width, height: q.gpus.length * rowH + 2, class: "quota" });
  const scale = Math.max(1, ...q.gpus.map((g) => g.nominal + g.borrowed));
  q.gpus.forEach((g, i) => {
    const y = i * rowH + 1, px = (n) => (n / scale) * barW;
    const own = Math.min(g.used - g.borrowed, g.nominal);
    chart.append(svg("text", { x: 0, y: y + 12, class: "label" }, g.gpuType));
    chart.append(svg("rect", { x: labelW, y: y + 2, width: px(g.nominal), height: rowH - 4, fill: "#e8eef5", stroke: "#9ab" }));
    chart.append(svg("rect", { x: labelW, y: y + 2, width: px(own), height: rowH - 4, fill: "#4a79b0", "data-part": "used" }));
    chart.append(svg("rect", { x: labelW + px(own), y: y + 2, width: px(g.lent), height: rowH - 4, fill: "#b9b9b9", "data-part": "lent" }));
    chart.append(svg("rect", { x: labelW + px(g.nominal), y: y + 2, width: px(g.borrowed), height: rowH - 4, fill: "#e0913a", "data-part": "borrowed" }));
    const shares = g.shareMilli ? ", shares " + g.usedShareMilli + "/" + g.shareMilli + " milli" : "";
    const text = g.used + " of " + g.nominal + " (" + g.borrowed + " borrowed, " + g.lent + " lent)" + shares;
    chart.append(svg("text", { x: labelW + barW + 6, y: y + 12, class: "label", "data-gpu-type": g.gpuType }, text));
  });
  return chart;
}

function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const cells of rows) {
    const tr = el("tr");
    for (const c of cells) tr.append(el("td", {}, c));
    body.append(tr);
  }
}

function draw(state) {
  drawMap(state);
  drawGantt(state);
  fill("queues", state.queues.map((q) => [
    q.name, q.cohort || "-", "", String(q.admitted), q.pending === null ? "-" : String(q.pending),
    q.next.join(", "),
  ]));
  document.querySelectorAll("#queues tbody tr").forEach((tr, i) => {
    const q = state.queues[i];
    tr.setAttribute("data-queue", q.name);
    tr.children[2].append(drawQuota(q));
  });
  fill("variants", state.variants.map((v) => [v.key, v.phase || "", v.residency ? JSON.stringify(v.residency) : ""]));
  fill("jobs", state.jobs.map((j) => [
    j.key, j.phase, j.queue,
    j.gpuType ? j.workers + " x " + j.gpuType + " until " + (j.finish || "?") : "",
    j.why || "", j.description || "",
  ]));
  for (const tr of document.querySelectorAll("#jobs tbody tr")) tr.setAttribute("data-job", tr.firstChild.textContent);
  fill("pipelines", state.pipelines.map((p) => [
    p.key, p.phase || "",
    (p.stages || []).map((s) => s.name + ": " + s.readyReplicas + "/" + s.replicas + " " + s.gpuType).join("; "),
    (p.predictedP99Ms ?? "") + " / " + (p.observedP99Ms ?? "-") + " / " + (p.sloMs ?? ""),
    p.sloMet ? p.sloMet.status + " (" + p.sloMet.reason + ")" : "",
    p.costPerHour ?? "", p.tuner || "",
  ]));
  document.querySelectorAll("#pipelines tbody tr").forEach((tr, i) => {
    const p = state.pipelines[i];
    tr.setAttribute("data-pipeline", p.key);
    if (p.sloMet) tr.children[4].setAttribute("title", p.sloMet.message || "");
    const cell = el("td");
    cell.append(drawP99(p));
    tr.append(cell);
  });
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

async function poll() {
  try {
    const resp = await fetch("/api/state", { cache: "no-store" });
    if (resp.ok) draw(await resp.json());
    else document.getElementById("updated").textContent = "server answered " + resp.status;
  } catch (err) {
    document.getElementById("updated").textContent = "cannot reach the operator";
  }
  setTimeout(poll, 2000);
}
poll();
