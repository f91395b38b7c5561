// ---- engine steps (docs/console.md) ----------------------------------------
// Appended to page.js (same script: it uses base, API, headers, el, svgEl,
// secs, tip, colour). Polls console/api/steps once a second; the server
// records steps only while some page polls.
(function () {
  const box = document.getElementById("steps");
  if (!box) return;
  const KEEP_US = 10e6;       // steps kept here per engine: the last 10 s
  const WINDOWS = [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10];
  const st = {engines: new Map(), since: null, window: 1, paused: false, end: 0, now: 0};
  const PHASES = [["schedule_us", "schedule", 5], ["execute_us", "execute", 0], ["postprocess_us", "postprocess", 2]];

  const controls = el("div", {class: "filters"});
  const sel = el("select", {id: "steps-window"});
  for (const w of WINDOWS) {
    const o = el("option", {value: w}, secs(w));
    if (w === st.window) o.selected = true;
    sel.appendChild(o);
  }
  const label = el("label", {}, "Window ");
  label.appendChild(sel);
  const pause = el("button", {type: "button"}, "pause");
  const legend = el("span", {class: "legend"});
  for (const [, name, c] of PHASES) {
    const i = el("i");
    i.style.background = colour(c);
    legend.appendChild(i);
    legend.appendChild(document.createTextNode(name));
  }
  legend.appendChild(document.createTextNode("  (lower bar: prefill / decode tokens)"));
  controls.append(label, pause, legend);
  const charts = el("div");
  box.append(controls, charts);

  sel.addEventListener("change", () => { st.window = Number(sel.value); draw(); });
  pause.addEventListener("click", () => {
    st.paused = !st.paused;
    pause.textContent = st.paused ? "resume" : "pause";
    draw();
  });

  function zoom(ev) {
    ev.preventDefault();
    const i = WINDOWS.indexOf(st.window);
    const j = Math.max(0, Math.min(WINDOWS.length - 1, i + (ev.deltaY > 0 ? 1 : -1)));
    st.window = WINDOWS[j];
    sel.value = String(st.window);
    draw();
  }

  function describe(s) {
    const lines = [
      "step of " + secs(s.dur_us / 1e6) + ", started " + secs(Math.max(0, st.end - s.t_us) / 1e6) + " before the right edge",
      "schedule " + secs(s.schedule_us / 1e6) + ", execute " + secs(s.execute_us / 1e6) +
        ", postprocess " + secs(s.postprocess_us / 1e6),
      "device " + secs(s.device_us / 1e6) + ", host " + secs(s.host_us / 1e6),
      s.batch.length + " request(s):",
    ];
    for (const q of s.batch.slice(0, 16)) {
      lines.push("  " + q.request_id + (q.prefill_tokens ? "  prefill " + q.prefill_tokens : "") +
        (q.decode_tokens ? "  decode " + q.decode_tokens : ""));
    }
    if (s.batch.length > 16) lines.push("  … " + (s.batch.length - 16) + " more");
    return lines.join("\n");
  }

  function draw() {
    charts.textContent = "";
    if (!st.paused) st.end = st.now;
    const W = Math.max(300, Math.min(1700, charts.clientWidth || 900)), H = 96, L = 8, R = 8;
    const from = st.end - st.window * 1e6;
    const x = (t) => L + (t - from) / (st.window * 1e6) * (W - L - R);
    for (const [engine, steps] of [...st.engines].sort((a, b) => a[0] - b[0])) {
      const fig = el("figure");
      const shown = steps.filter((s) => s.t_us + s.dur_us >= from && s.t_us <= st.end);
      fig.appendChild(el("figcaption", {}, "engine " + engine + ": " + shown.length + " steps in the last " + secs(st.window)));
      const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, style: "width:100%;height:auto;border:1px solid #ddd;display:block"});
      const maxTok = Math.max(1, ...shown.map((s) => s.batch.reduce((a, q) => a + q.prefill_tokens + q.decode_tokens, 0)));
      for (const s of shown) {
        const g = svgEl("g");
        let t = s.t_us;
        for (const [key, , c] of PHASES) {
          const x0 = x(t), x1 = x(t + s[key]);
          g.appendChild(svgEl("rect", {x: x0, y: 4, width: Math.max(0.5, x1 - x0), height: 40, fill: colour(c)}));
          t += s[key];
        }
        const pre = s.batch.reduce((a, q) => a + q.prefill_tokens, 0);
        const dec = s.batch.reduce((a, q) => a + q.decode_tokens, 0);
        const x0 = x(s.t_us), w = Math.max(0.5, x(s.t_us + s.dur_us) - x0);
        const hp = 40 * pre / maxTok, hd = 40 * dec / maxTok;
        g.appendChild(svgEl("rect", {x: x0, y: 92 - hd - hp, width: w, height: hp, fill: colour(3)}));
        g.appendChild(svgEl("rect", {x: x0, y: 92 - hd, width: w, height: hd, fill: colour(4)}));
        g.addEventListener("mousemove", (ev) => tip(ev, describe(s)));
        g.addEventListener("mouseleave", () => tip(null));
        svg.appendChild(g);
      }
      svg.addEventListener("wheel", zoom, {passive: false});
      fig.appendChild(svg);
      charts.appendChild(fig);
    }
    if (!st.engines.size) charts.appendChild(el("p", {class: "note"}, "no step yet (the engines record while this page is open)"));
  }

  async function poll() {
    // Not before the snapshot says what is served: a proxy has no engine
    // steps, and its panel is hidden and never asks.
    if (!state.meta) return setTimeout(poll, 200);
    if (state.meta.serving === "proxy") return;
    try {
      const q = st.since === null ? "" : "?since_us=" + st.since;
      const r = await fetch(base + API + "steps" + q, {headers: headers(), cache: "no-store"});
      if (r.ok) {
        const body = await r.json();
        st.now = body.now_us;
        for (const e of body.engines) {
          const list = st.engines.get(e.engine) || [];
          const last = list.length ? list[list.length - 1].t_us : -1;
          for (const s of e.steps) if (s.t_us > last) list.push(s);
          while (list.length && list[0].t_us < st.now - KEEP_US) list.shift();
          st.engines.set(e.engine, list);
        }
        // From the engine that is furthest behind: each engine's list drops
        // what it already has.
        const lasts = [...st.engines.values()].filter((l) => l.length).map((l) => l[l.length - 1].t_us);
        if (lasts.length) st.since = Math.min(...lasts);
        // Paused: the data keeps coming, the drawing (and a hovered step) stays.
        if (!st.paused) draw();
      }
    } catch (e) {
      // The main panels report the connection; try again next second.
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
