"use strict";
// The series colours of the bench's report (inferscope_schema::palette).
const PALETTE = /*PALETTE*/[];
const API = "console/api/";
const SVG = "http://www.w3.org/2000/svg";
const LATENCIES = [["ttft", "Time to first token"], ["itl", "Inter-token latency"],
  ["e2e", "End-to-end latency"], ["queue", "Queue time"]];

const state = {meta: null, samples: [], recent: [], findings: null, playground: null,
  key: sessionStorage.getItem("inferscope-key") || ""};
const $ = (id) => document.getElementById(id);
const base = location.pathname.endsWith("/") ? location.pathname : location.pathname.replace(/[^/]*$/, "");

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function secs(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  if (s === 0) return "0";
  if (s >= 1) return s.toFixed(s >= 10 ? 1 : 2) + " s";
  if (s >= 0.001) return (s * 1e3).toFixed(s >= 0.1 ? 0 : 1) + " ms";
  return (s * 1e6).toFixed(0) + " µs";
}
function num(v) {
  if (!isFinite(v)) return "–";
  if (Math.abs(v) >= 100) return v.toFixed(0);
  if (Math.abs(v) >= 10) return v.toFixed(1);
  return v.toFixed(2);
}
function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }
function colour(i) { return PALETTE[i % PALETTE.length] || "#222"; }
function headers() { return state.key ? {Authorization: "Bearer " + state.key} : {}; }
function status(text) { $("status").textContent = text; }

// ---- data ----------------------------------------------------------------

function addSample(s) {
  state.samples.push(s);
  const keep = state.meta ? state.meta.history_seconds : 300;
  if (state.samples.length > keep) state.samples.splice(0, state.samples.length - keep);
}
function addRecent(list) {
  for (const r of list) state.recent.push(r);
  if (state.recent.length > 256) state.recent.splice(0, state.recent.length - 256);
}
// Bucket counts of `key` between samples a and b, over all engines.
function bucketDelta(key, a, b) {
  const n = state.meta.latency_bounds[key].length + 1;
  const out = new Array(n).fill(0);
  b.engines.forEach((e, j) => {
    const before = a.engines[j] ? a.engines[j].latency[key] : null;
    for (let i = 0; i < n; i++) out[i] += e.latency[key][i] - (before ? before[i] : 0);
  });
  return out;
}
// The bucket holding quantile q: its index, or -1 with no observations.
function quantileBucket(counts, q) {
  const n = counts.reduce((a, c) => a + c, 0);
  if (n === 0) return -1;
  const rank = q * n;
  let cum = 0;
  for (let i = 0; i < counts.length; i++) { cum += counts[i]; if (cum >= rank) return i; }
  return counts.length - 1;
}
function boundText(key, i) {
  const b = state.meta.latency_bounds[key];
  return i < b.length ? "≤ " + secs(b[i]) : "> " + secs(b[b.length - 1]);
}

// ---- charts --------------------------------------------------------------

// Charts are drawn at their box's width, so their text is never scaled down.
const H = 240, L = 56, R = 12, T = 12, B = 34;
function chartWidth(box) { return Math.max(300, Math.min(900, box.clientWidth || 600)); }

// A tick step of 1, 2 or 5 × 10^k giving about four intervals up to `v`.
function niceStep(v) {
  if (!(v > 0)) return 0.25;
  const raw = v / 4, p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5]) if (m * p >= raw) return m * p;
  return 10 * p;
}
// Ticks from 0 to the first multiple of the step at or above `v`.
function ticks(v) {
  const step = niceStep(v), top = Math.max(step, Math.ceil(v / step - 1e-9) * step), out = [];
  for (let k = 0; k * step <= top + step / 2; k++) out.push(k * step);
  return out;
}

// The line charts are drawn on the server by the bench report's chart code
// (GET console/api/charts, in this page's clock time): one request at a
// time, after each sample; their bands' <title>s are the hover text.
let chartsBusy = false;
async function renderCharts() {
  if (chartsBusy || !state.meta) return;
  chartsBusy = true;
  try {
    const offset = -new Date().getTimezoneOffset() * 60;
    const r = await fetch(base + API + "charts?utc_offset=" + offset, {headers: headers(), cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const charts = await r.json();
    $("tokens-chart").innerHTML = charts.tokens;
    $("requests-chart").innerHTML = charts.requests;
    for (const [key, svg] of Object.entries(charts.latency)) {
      const box = document.querySelector(`[data-latency="${key}"] .quant`);
      if (box) box.innerHTML = svg;
    }
  } catch (e) {
    status("charts: " + e.message);
  } finally {
    chartsBusy = false;
  }
}

// A bar chart of bucket counts with the buckets' bounds as labels.
function bucketChart(box, key, counts) {
  box.textContent = "";
  const W = chartWidth(box);
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  box.appendChild(svg);
  const bounds = state.meta.latency_bounds[key];
  const n = counts.length;
  const tk = ticks(Math.max(1, ...counts));
  const cmax = tk[tk.length - 1];
  const bw = (W - L - R) / n;
  const y = (v) => H - B - (H - T - B) * v / cmax;
  for (const v of tk) {
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid"}));
    svg.appendChild(svgEl("text", {x: L - 4, y: y(v) + 4, "text-anchor": "end"}, num(v)));
  }
  const every = Math.ceil(n / Math.floor(W / 75));
  counts.forEach((c, i) => {
    const lo = i === 0 ? 0 : bounds[i - 1];
    const label = i < bounds.length ? `(${secs(lo)}, ${secs(bounds[i])}]` : `> ${secs(bounds[bounds.length - 1])}`;
    const bar = svgEl("rect", {x: L + i * bw + 1, y: y(c), width: Math.max(bw - 2, 1), height: H - B - y(c), fill: colour(0)});
    bar.addEventListener("mousemove", (ev) => tip(ev, `${label}\n${c} requests` + (key === "itl" ? " (token gaps)" : "")));
    bar.addEventListener("mouseleave", () => tip(null));
    svg.appendChild(bar);
    if (i % every === 0) {
      svg.appendChild(svgEl("text", {x: L + i * bw + bw / 2, y: H - B + 14, "text-anchor": "middle"},
        i < bounds.length ? "≤" + secs(bounds[i]) : "+Inf"));
    }
  });
  svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis"}));
  svg.appendChild(svgEl("text", {x: (W + L) / 2, y: H - 3, "text-anchor": "middle"}, "bucket upper bound"));
}

function tip(ev, text) {
  const t = $("tooltip");
  if (!ev) { t.hidden = true; return; }
  t.textContent = text;
  t.hidden = false;
  const x = Math.min(ev.clientX + 12, window.innerWidth - t.offsetWidth - 4);
  t.style.left = Math.max(0, x) + "px";
  t.style.top = (ev.clientY + 12) + "px";
}

// ---- panels --------------------------------------------------------------

function renderEngines() {
  const box = $("engines");
  box.textContent = "";
  const ss = state.samples;
  if (!ss.length) return;
  const last = ss[ss.length - 1], prev = ss.length > 1 ? ss[ss.length - 2] : null, first = ss[0];
  last.engines.forEach((e, j) => {
    const card = el("div", {class: "card", "data-engine": e.engine});
    card.appendChild(el("h3", {}, "Engine " + e.engine));
    const dl = el("dl");
    const row = (name, value, cls) => { dl.appendChild(el("dt", {}, name)); dl.appendChild(el("dd", {class: cls}, value)); };
    const meter = (frac, c) => {
      const m = el("div", {class: "meter"});
      const f = el("div");
      f.style.width = Math.max(0, Math.min(1, frac)) * 100 + "%";
      f.style.background = c;
      m.appendChild(f);
      dl.appendChild(m);
    };
    row("running", String(e.running), "running");
    row("waiting", String(e.waiting), "waiting");
    row("KV cache", (e.kv_cache_usage * 100).toFixed(1) + " %", "kv");
    meter(e.kv_cache_usage, colour(0));
    let busy = NaN;
    if (prev && prev.engines[j] && last.t > prev.t) busy = (e.device_busy_seconds - prev.engines[j].device_busy_seconds) / (last.t - prev.t);
    row("device busy", isFinite(busy) ? (busy * 100).toFixed(0) + " %" : "–", "busy");
    meter(busy, colour(1));
    row("preemptions", String(e.preemptions - (first.engines[j] ? first.engines[j].preemptions : 0)), "preemptions");
    card.appendChild(dl);
    box.appendChild(card);
  });
}

// The palette's red, orange, blue and green (inferscope_schema::palette::SERIES), by severity.
const SEVERITY_COLOUR = {critical: 1, warning: 3, info: 0, ok: 2};

function evidenceText(e) {
  if (e.unit === "s") return secs(e.value);
  if (e.unit === "ratio") return (e.value * 100).toFixed(1) + " %";
  return num(e.value) + (e.unit ? " " + e.unit.replace("per_s", "/s") : "");
}

function renderFindings() {
  const box = $("findings");
  box.textContent = "";
  const f = state.findings;
  const note = state.meta.findings_note;
  if (!f) {
    $("findings-note").textContent = state.meta.findings_note.startsWith("not computed")
      ? "Not computed: " + note.replace(/^not computed: /, "")
      : "Waiting for the first diagnosis (" + note + ").";
    return;
  }
  $("findings-note").textContent = "Over the last " + num(f.window_s) + " s: " + note +
    ". Evidence is measured over that window; latency figures from histograms are bucket bounds.";
  for (const x of f.findings) {
    const c = colour(SEVERITY_COLOUR[x.severity] ?? 5);
    const div = el("div", {class: "finding", "data-id": x.id, "data-severity": x.severity});
    div.style.borderLeftColor = c;
    const h = el("h3");
    const sev = el("span", {class: "sev"}, x.severity);
    sev.style.background = c;
    h.appendChild(sev);
    h.appendChild(document.createTextNode(x.title));
    div.appendChild(h);
    const ev = el("div", {class: "evidence"});
    for (const e of x.evidence) ev.appendChild(el("span", {title: e.name + " (" + e.unit + ")"}, e.name + ": " + evidenceText(e)));
    div.appendChild(ev);
    div.appendChild(el("p", {class: "action"}, "→ " + x.action));
    box.appendChild(div);
  }
}

// The latency panels: a proxy measures no queue time.
function latencies() {
  return state.meta.serving === "proxy" ? LATENCIES.filter(([key]) => key !== "queue") : LATENCIES;
}

function renderLatency() {
  const box = $("latency");
  const ss = state.samples;
  if (!box.children.length) {
    for (const [key, title] of latencies()) {
      const f = el("figure", {"data-latency": key});
      f.appendChild(el("figcaption", {}, title));
      f.appendChild(el("div", {class: "summary note"}));
      f.appendChild(el("div", {class: "chart dist"}));
      f.appendChild(el("div", {class: "chart quant"}));
      box.appendChild(f);
    }
  }
  for (const [key] of latencies()) {
    const f = box.querySelector(`[data-latency="${key}"]`);
    if (!ss.length) continue;
    const first = ss[0], last = ss[ss.length - 1];
    // The first sample's counts are the base: the window is (first, last].
    const counts = ss.length > 1 ? bucketDelta(key, first, last) : bucketDelta(key, {engines: []}, last);
    const n = counts.reduce((a, c) => a + c, 0);
    const q50 = quantileBucket(counts, 0.5), q99 = quantileBucket(counts, 0.99);
    f.querySelector(".summary").textContent = n
      ? `${n} ${key === "itl" ? "token gaps" : "requests"}; p50 ${boundText(key, q50)}, p99 ${boundText(key, q99)} (bucket bounds)`
      : "no observations in the window";
    bucketChart(f.querySelector(".dist"), key, counts);
  }
}

// With tenants (API keys), the busiest ones over the requests listed:
// their prompt + generated tokens and share, and the tenant filter's options.
function renderTenants() {
  const tokens = new Map();
  for (const r of state.recent) {
    if (!r.tenant) continue;
    tokens.set(r.tenant, (tokens.get(r.tenant) || 0) + (r.prompt_tokens || 0) + (r.completion_tokens || 0));
  }
  // A server without keys has one tenant, `anonymous`: nothing to compare.
  const shown = [...tokens.keys()].some((t) => t !== "anonymous");
  $("tenants").hidden = !shown;
  $("tenant-filter-label").hidden = !shown;
  for (const th of document.querySelectorAll(".tenant-col")) th.hidden = !shown;
  if (!shown) return false;
  const total = [...tokens.values()].reduce((a, b) => a + b, 0) || 1;
  const ranked = [...tokens.entries()].sort((a, b) => b[1] - a[1]);
  const top = ranked.slice(0, 5).map(([t, n]) => `${t} ${n} tokens (${(100 * n / total).toFixed(0)} %)`);
  const more = ranked.length > 5 ? ` +${ranked.length - 5} more` : "";
  $("tenants").textContent = `Busiest tenants over the ${state.recent.length} requests listed: ${top.join(", ")}${more}`;
  const select = $("tenant-filter");
  const have = new Set([...select.options].map((o) => o.value));
  for (const [t] of ranked) if (!have.has(t)) select.appendChild(el("option", {value: t}, t));
  return true;
}

function renderRecent() {
  const body = $("recent").tBodies[0];
  body.textContent = "";
  const filter = $("filter").value;
  const slow = Number($("slow-ms").value) || 0;
  const tenants = renderTenants();
  const tenant = $("tenant-filter").value;
  const rows = state.recent.slice().reverse().filter((r) => {
    if (tenant && r.tenant !== tenant) return false;
    if (filter === "failed") return r.finish_reason === "abort" || r.finish_reason === "error";
    if (filter === "slow") return r.generation_time_ms > slow;
    return true;
  });
  const longest = Math.max(1, ...rows.map((r) => r.generation_time_ms));
  for (const r of rows) {
    const tr = el("tr", {class: r.finish_reason === "abort" || r.finish_reason === "error" ? "failed" : ""});
    const ms = (v) => (v === null || v === undefined) ? "–" : secs(v / 1000);
    const text = (v) => (v === null || v === undefined) ? "–" : String(v);
    const cells = [clock(r.timestamp), r.request_id, text(r.engine), r.finish_reason, text(r.prompt_tokens),
      text(r.completion_tokens), ms(r.queue_time_ms), ms(r.prefill_time_ms), ms(r.decode_time_ms),
      ms(r.time_to_first_token_ms), ms(r.generation_time_ms)];
    if (tenants) cells.splice(2, 0, text(r.tenant));
    cells.forEach((c, i) => {
      const td = el("td", {}, c);
      if (i === 1) td.title = (r.trace_id ? "trace " + r.trace_id + "\n" : "") + r.request_id;
      if (c === r.finish_reason && i === (tenants ? 4 : 3)) td.className = "reason";
      tr.appendChild(td);
    });
    const td = el("td", {class: "bar-col"});
    const bar = el("div", {class: "bar"});
    // Through a proxy the first token's wait (queue and prefill upstream)
    // is one segment, drawn as prefill.
    const segments = r.queue_time_ms === null && r.prefill_time_ms === null
      ? [["time_to_first_token_ms", "p"], ["decode_time_ms", "d"]]
      : [["queue_time_ms", "q"], ["prefill_time_ms", "p"], ["decode_time_ms", "d"]];
    segments.forEach(([k, cls]) => {
      const seg = el("div", {class: cls});
      seg.style.width = (100 * (r[k] || 0) / longest) + "%";
      seg.title = (k === "time_to_first_token_ms" ? "TTFT" : k.replace("_time_ms", "")) + " " + ms(r[k]);
      bar.appendChild(seg);
    });
    td.appendChild(bar);
    tr.appendChild(td);
    body.appendChild(tr);
  }
}

function render() {
  for (const w of document.querySelectorAll(".window")) {
    const ss = state.samples;
    w.textContent = ss.length > 1 ? Math.round(ss[ss.length - 1].t - ss[0].t) + " s" : "–";
  }
  renderEngines();
  renderFindings();
  renderLatency();
  renderRecent();
  renderPlaygroundTimings();
}

// ---- playground ----------------------------------------------------------

// The server's timings of the playground's last request: its `metrics`, else
// its row in the recent requests once it arrives.
function renderPlaygroundTimings() {
  const pg = state.playground;
  const box = $("pg-timings");
  box.textContent = "";
  if (!pg) return;
  const row = (name, value, cls) => {
    const d = el("div", {class: cls});
    d.appendChild(el("dt", {}, name));
    d.appendChild(el("dd", {}, value));
    box.appendChild(d);
  };
  const ms = (v) => (v === null || v === undefined) ? "–" : secs(v / 1000);
  row("TTFT seen here", pg.clientTtft === null ? "–" : secs(pg.clientTtft), "client-ttft");
  let m = pg.metrics;
  let source = "response metrics";
  if (!m) {
    m = state.recent.find((r) => r.request_id.startsWith(pg.id + "-"));
    source = "recent requests";
  }
  if (m) {
    row("server TTFT", ms(m.time_to_first_token_ms), "server-ttft");
    row("queue", ms(m.queue_time_ms), "queue");
    row("prefill", ms(m.prefill_time_ms), "prefill");
    row("decode", ms(m.decode_time_ms), "decode");
    row("e2e", ms(m.generation_time_ms), "e2e");
    row("tokens/s", num(m.tokens_per_second), "tps");
    row("from", source, "source");
  }
  if (pg.usage) row("tokens", pg.usage.prompt_tokens + " in, " + pg.usage.completion_tokens + " out", "usage");
}

async function sendPlayground(ev) {
  ev.preventDefault();
  const id = "playground-" + Date.now().toString(36);
  const pg = {id, clientTtft: null, metrics: null, usage: null};
  state.playground = pg;
  $("pg-reply").textContent = "";
  $("pg-send").disabled = true;
  $("pg-status").textContent = "sending…";
  renderPlaygroundTimings();
  const body = {
    model: state.meta ? state.meta.model : undefined,
    messages: [{role: "user", content: $("pg-prompt").value}],
    max_tokens: Number($("pg-max").value) || 64,
    temperature: Number($("pg-temp").value),
    stream: true,
    stream_options: {include_usage: true},
    include_metrics: true,
  };
  const sent = performance.now();
  try {
    const r = await fetch(base + "v1/chat/completions", {
      method: "POST",
      headers: Object.assign({"Content-Type": "application/json", "x-request-id": id}, headers()),
      body: JSON.stringify(body),
    });
    if (!r.ok) {
      let why = "HTTP " + r.status;
      try { why += ": " + (await r.json()).error.message; } catch (e) { /* not JSON */ }
      if (r.status === 404) why += " (the API is not served on this listener: the console is on --metrics-port)";
      throw new Error(why);
    }
    $("pg-status").textContent = "streaming…";
    await readEvents(r, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const text = chunk.choices && chunk.choices[0] && chunk.choices[0].delta && chunk.choices[0].delta.content;
      if (text) {
        if (pg.clientTtft === null) pg.clientTtft = (performance.now() - sent) / 1000;
        $("pg-reply").textContent += text;
      }
      if (chunk.usage) pg.usage = chunk.usage;
      if (chunk.metrics) pg.metrics = chunk.metrics;
    });
    $("pg-status").textContent = "done";
  } catch (e) {
    $("pg-status").textContent = "failed: " + e.message;
  }
  $("pg-send").disabled = false;
  renderPlaygroundTimings();
}

// ---- transport -----------------------------------------------------------

async function connect() {
  let r;
  try {
    r = await fetch(base + API + "snapshot", {headers: headers(), cache: "no-store"});
  } catch (e) {
    status("cannot reach the server; retrying");
    return setTimeout(connect, 2000);
  }
  if (r.status === 401) {
    $("keyform").hidden = false;
    status(state.key ? "wrong API key" : "needs the API key");
    return;
  }
  if (!r.ok) { status("snapshot: HTTP " + r.status + "; retrying"); return setTimeout(connect, 2000); }
  const snap = await r.json();
  state.meta = snap;
  state.findings = snap.findings;
  state.samples = [];
  state.recent = [];
  snap.samples.forEach(addSample);
  addRecent(snap.recent);
  $("model").textContent = snap.model;
  // Through a proxy: no engine gauges, steps or queue time (only an engine
  // knows them); the requests' timings are the client's side of them.
  const proxy = snap.serving === "proxy";
  $("engines-panel").hidden = proxy;
  $("steps-panel").hidden = proxy;
  if (proxy) {
    $("recent-note").textContent = "The last finished requests (each choice), measured by the proxy from the client's side: " +
      "time to first token and decode (first to last token); queue and prefill happen upstream and are not known here. Never their text.";
  }
  $("keyform").hidden = true;
  render();
  renderCharts();
  stream();
}

// Calls `onData` with each server-sent event's data, until the body ends.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buf += dec.decode(value, {stream: true});
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data) onData(data);
    }
  }
}

// SSE read with fetch, so the API key travels in a header (EventSource
// cannot send one).
async function stream() {
  try {
    // From the last request this page has: none finishes unseen in between.
    const after = state.recent.length ? state.recent[state.recent.length - 1].seq : 0;
    const r = await fetch(base + API + "events?after=" + after, {headers: headers(), cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    status("live");
    await readEvents(r, (data) => {
      const msg = JSON.parse(data);
      addSample(msg.sample);
      addRecent(msg.recent);
      if (msg.findings !== undefined) state.findings = msg.findings;
      status("live, " + clock(msg.sample.t));
      render();
      renderCharts();
    });
  } catch (e) {
    status("disconnected (" + e.message + "); reconnecting");
  }
  setTimeout(connect, 2000);
}

$("keyform").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.key = $("key").value;
  sessionStorage.setItem("inferscope-key", state.key);
  connect();
});
$("filter").addEventListener("change", renderRecent);
$("tenant-filter").addEventListener("change", renderRecent);
$("playground").addEventListener("submit", sendPlayground);
$("slow-ms").addEventListener("input", renderRecent);
for (const [cls, i] of [["q", 2], ["p", 3], ["d", 4]]) {
  const style = document.createElement("style");
  style.textContent = `.bar .${cls},.legend .${cls}{background:${colour(i)}}`;
  document.head.appendChild(style);
}
window.addEventListener("resize", () => { if (state.meta) render(); });
connect();
