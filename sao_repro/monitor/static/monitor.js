// The monitor page's script, served as /static/monitor.js (nbs/56_monitor_page.ipynb describes the page).
"use strict";
const SPEC = JSON.parse(document.getElementById("chart-spec").textContent);
const KEY = new URLSearchParams(location.search).get("key");
const PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037"];
const FLAGS = ["oom", "nan", "crashed", "stalled", "finished",
  // SAO health (sao_repro.metrics.health.SAO_FLAGS): the span's title gives the step that set it
  "critic_negative", "critic_flat", "critic_starved", "all_negative", "dis_heavy", "degenerate_returns",
  "mismatch_high"];
const colors = {};
let polls = 0;
const SETTING_COLORS = JSON.parse(document.getElementById("setting-colors").textContent);  // the report's
function colorOf(setting) {
  if (!(setting in colors)) colors[setting] = SETTING_COLORS[setting] || PALETTE[Object.keys(colors).length % PALETTE.length];
  return colors[setting];
}
function withKey(url) { return KEY ? url + (url.includes("?") ? "&" : "?") + "key=" + encodeURIComponent(KEY) : url; }
async function api(path) {
  const headers = KEY ? {"X-API-Key": KEY} : {};
  const r = await fetch(path, {headers: headers, cache: "no-store"});
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function pct(r) { return r.total_bytes ? Math.floor(100 * r.loaded_bytes / r.total_bytes) : 0; }
function renderRuns(runs) {
  const body = document.querySelector("#runs tbody");
  body.replaceChildren();
  for (const r of runs) {
    const tr = el("tr");
    tr.dataset.run = r.run;
    const on = FLAGS.filter(f => r.flags[f]);
    tr.dataset.flags = on.join(" ");
    const rate = r.flags.reward_timeout_rate;
    const skipped = Object.values(r.skipped || {}).reduce((a, b) => a + b, 0);
    const cells = [r.run, r.setting, r.seed === null ? "-" : r.seed, r.last_step === null ? "-" : r.last_step];
    for (const c of cells) tr.append(el("td", "", String(c)));
    const ft = el("td", "flags");
    for (const f of on) {
      const sp = el("span", "flag flag-" + f, f);
      const at = (r.flag_steps || {})[f];
      if (at !== null && at !== undefined) sp.title = f + " since step " + at;
      ft.append(sp);
    }
    if (r.loading) ft.append(el("span", "flag flag-loading", "loading " + pct(r) + "%"));  // a big log read over several polls
    else if (!on.length) ft.append(el("span", "flag flag-ok", "running"));
    if (r.messages && r.messages.length) ft.title = r.messages.join("\n");  // the log lines behind the flags
    tr.append(ft);
    tr.append(el("td", "", rate === null || rate === undefined ? "-" : (100 * rate).toFixed(2) + "% (" + r.reward_timeouts + ")"));
    tr.append(el("td", "", String(skipped)));
    const lt = el("td");
    for (const f of (r.files || [])) {
      const a = el("a", "", f.split("/").pop());
      a.href = withKey("files/" + f.split("/").map(encodeURIComponent).join("/"));
      lt.append(a);
    }
    tr.append(lt);
    body.append(tr);
  }
}

function ema(values, span) {
  if (span <= 1) return values;
  const a = 2 / (span + 1);
  let m = null;
  return values.map(v => { if (v === null) return null; m = m === null ? v : a * v + (1 - a) * m; return m; });
}
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { hi = lo + 1; lo = lo - 1; }
  const raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-12; t += step) ticks.push(+t.toPrecision(12));
  return ticks;
}
function makeChart(spec) {
  const box = el("div", "chart");
  box.append(el("h2", "", spec.title));
  const c = el("canvas");
  c.dataset.metric = spec.metric;
  c.dataset.points = "0";
  box.append(c);
  document.getElementById("charts").append(box);
  return c;
}
const canvases = SPEC.map(makeChart);
function drawChart(c, series) {
  const dpr = window.devicePixelRatio || 1, W = c.clientWidth || 420, H = c.clientHeight || 240;
  c.width = W * dpr; c.height = H * dpr;
  const g = c.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, W, H);
  const pts = series.flatMap(s => s.step.map((x, i) => [x, s.value[i]])).filter(p => p[1] !== null);
  const raw = series.flatMap(s => s.raw ? s.step.map((x, i) => [x, s.raw[i]]) : []).filter(p => p[1] !== null);
  c.dataset.points = String(pts.length);
  c.dataset.rawPoints = String(raw.length);
  c.dataset.series = String(series.length);
  g.font = "11px sans-serif"; g.fillStyle = "#666";
  if (!pts.length) { g.fillText("no data yet", W / 2 - 30, H / 2); return; }
  const L = 52, R = 10, T = 8, B = 24;
  let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  let y0 = Math.min(...pts.concat(raw).map(p => p[1])), y1 = Math.max(...pts.concat(raw).map(p => p[1]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = 0.05 * (y1 - y0);
  y0 -= pad; y1 += pad;
  c.dataset.lastStep = String(x1);
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R), Y = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  g.strokeStyle = "#eee"; g.lineWidth = 1;
  for (const t of niceTicks(y0, y1, 4)) { g.beginPath(); g.moveTo(L, Y(t)); g.lineTo(W - R, Y(t)); g.stroke(); g.fillText(String(+t.toPrecision(4)), 4, Y(t) + 4); }
  for (const t of niceTicks(x0, x1, 5)) { g.fillText(String(t), X(t) - 8, H - 8); }
  g.strokeStyle = "#999"; g.strokeRect(L, T, W - L - R, H - T - B);
  g.globalAlpha = 0.22;  // the raw values, faint, behind the smoothed lines
  for (const s of series) {
    if (!s.raw) continue;
    g.fillStyle = s.color;
    s.step.forEach((x, i) => { const v = s.raw[i]; if (v !== null) g.fillRect(X(x) - 1, Y(v) - 1, 2, 2); });
  }
  g.globalAlpha = 1;
  for (const s of series) {
    g.strokeStyle = s.color; g.lineWidth = 1.6; g.beginPath();
    let pen = false;
    s.step.forEach((x, i) => { const v = s.value[i]; if (v === null) { pen = false; return; } if (pen) g.lineTo(X(x), Y(v)); else g.moveTo(X(x), Y(v)); pen = true; });
    g.stroke();
    g.fillStyle = s.color;
    s.step.forEach((x, i) => {  // a point with no neighbour to join is drawn as a dot
      const v = s.value[i], prev = i > 0 ? s.value[i - 1] : null, next = i + 1 < s.value.length ? s.value[i + 1] : null;
      if (v !== null && prev === null && next === null) { g.beginPath(); g.arc(X(x), Y(v), 2.5, 0, 2 * Math.PI); g.fill(); }
    });
  }
}

function renderLegend(runs) {
  const lg = document.getElementById("legend");
  lg.replaceChildren();
  for (const s of [...new Set(runs.map(r => r.setting))].sort()) {
    const sp = el("span");
    const sw = el("i");
    sw.style.background = colorOf(s);
    sp.append(sw, document.createTextNode(s));
    lg.append(sp);
  }
}
let last = null;
function renderCharts() {
  if (!last) return;
  const span = +document.getElementById("smooth").value;
  document.getElementById("smooth-v").textContent = String(span);
  SPEC.forEach((spec, k) => {
    const series = [];
    last.data.forEach((d, j) => {
      const m = d.metrics[spec.metric];
      if (m) series.push({step: m.step, value: ema(m.value, span), raw: span > 1 ? m.value : null,
                          color: colorOf(last.runs[j].setting)});
    });
    drawChart(canvases[k], series);
  });
}
let wait = 2000;
async function poll() {
  const status = document.getElementById("status");
  try {
    const runs = await api("api/runs");
    const names = SPEC.map(s => s.metric).join(",");
    const data = await Promise.all(runs.map(r => api("api/metrics?run=" + encodeURIComponent(r.run) + "&metrics=" + encodeURIComponent(names))));
    last = {runs: runs, data: data};
    renderRuns(runs); renderLegend(runs); renderCharts();
    polls += 1;
    document.body.dataset.polls = String(polls);
    if (runs.length && data.some(d => Object.keys(d.metrics).length)) document.body.dataset.loaded = "1";
    const loading = runs.filter(r => r.loading);
    const mb = x => (x / 1048576).toFixed(0);
    status.textContent = runs.length + " runs · " + (loading.length
      ? "loading " + mb(loading.reduce((a, r) => a + r.loaded_bytes, 0)) + " of " + mb(loading.reduce((a, r) => a + r.total_bytes, 0)) + " MB…"
      : "updated " + new Date().toLocaleTimeString());
    document.body.dataset.loading = loading.length ? "1" : "";
    wait = loading.length ? 300 : 2000;  // poll on quickly while a big log loads: each request reads the next part
  } catch (e) {
    status.textContent = "error: " + e.message;
  }
  setTimeout(poll, wait);
}
document.getElementById("smooth").addEventListener("input", renderCharts);
window.addEventListener("resize", renderCharts);
poll();
