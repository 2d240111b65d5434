// privdl serve: the page. Plain JavaScript, no build step, nothing fetched from the internet.
// Every number comes from the server (the CLI's accounting functions); this file only sends the
// form, polls the job, and draws tables and SVG charts.
"use strict";

const $ = (id) => document.getElementById(id);
const FIELDS = {
  decor: ["graph", "sigma_cdp", "sigma_cor", "clip", "steps", "delta", "adversary", "q", "unit",
          "sampling_rate", "batch_size", "sampling", "neighbouring", "conversion"],
  "calibrate-decor": ["graph", ["epsilon", "cal_epsilon"], ["sigma_cdp", "cal_sigma_cdp"], "clip",
                      "steps", "delta", "adversary", "q", ["conversion", "cal_conversion"]],
  dpsgd: ["noise_multiplier", ["sampling_rate", "d_sampling_rate"], ["steps", "d_steps"],
          ["delta", "d_delta"], ["sampling", "d_sampling"], ["neighbouring", "d_neighbouring"],
          ["dataset_size", "d_dataset_size"], ["threat_model", "d_threat_model"],
          ["accountant", "d_accountant"]],
  plan: ["plan", "plan_gradient_bound", "plan_tau", "plan_steps", "plan_local_samples",
         "plan_epsilon", "plan_delta", "plan_c2", "plan_c", "plan_batch_size", "plan_dataset_size",
         "plan_local_epochs", "plan_rounds"],
};
FIELDS["calibrate-dpsgd"] = [["epsilon", "d_epsilon"], ...FIELDS.dpsgd.slice(1)];
const COLORS = ["#2457a6", "#c2410c", "#15803d", "#7e22ce", "#a16207", "#0e7490", "#be185d"];

let tab = "decor";
let currentJob = null;
let pollTimer = null;
const defaults = {};

// ------------------------------------------------------------------ helpers
function fmt(x) {
  if (x === null || x === undefined) return "–";
  if (x === "inf") return "∞";
  if (x === "-inf") return "-∞";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : Number(x.toPrecision(6)).toString();
  return String(x);
}
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
function numCell(x, id) {
  const td = el("td", { class: "num", id, "data-value": typeof x === "number" ? String(x) : (x ?? "") }, fmt(x));
  return td;
}
function table(headers, rows, attrs = {}) {
  const t = el("table", attrs);
  t.append(el("tr", {}, ...headers.map((h) => el("th", {}, h))));
  for (const r of rows) t.append(r);
  return el("div", { class: "tablewrap" }, t);
}
function showError(box, message) {
  box.textContent = message;
  box.hidden = !message;
}
async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new Error("the privdl server does not answer (is `privdl serve` still running?)");
  }
  let data;
  try { data = await resp.json(); } catch (e) { data = { error: `HTTP ${resp.status}` }; }
  if (!resp.ok) throw new Error(data.error || `HTTP ${resp.status}`);
  return data;
}

// ------------------------------------------------------------------ form and permalink
function formIds() {
  return [...document.querySelectorAll("#graph-panel input[id]:not([type=file]), #form input[id], #form select[id]")]
    .map((e) => e.id);
}
function paramsFor(kind) {
  const out = {};
  for (const f of FIELDS[kind]) {
    const [name, id] = Array.isArray(f) ? f : [f, f];
    out[name] = $(id).value.trim();
  }
  return out;
}
function permalink() {
  const q = new URLSearchParams();
  q.set("tab", tab);
  for (const id of formIds()) if ($(id).value !== defaults[id]) q.set(id, $(id).value);
  return `${location.pathname}?${q.toString()}`;
}
function restore() {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of q.entries()) {
    const e = $(k);
    if (k !== "tab" && e && formIds().includes(k)) e.value = v;
  }
  if (q.has("tab") && FIELDS[q.get("tab")]) selectTab(q.get("tab"));
  return [...q.keys()].length > 0;
}
function selectTab(name) {
  tab = name;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const e of document.querySelectorAll("#form [data-tabs]")) e.hidden = !e.dataset.tabs.split(" ").includes(name);
  updateVisibility();
}
function updateVisibility() {
  const plan = $("plan").value;
  for (const e of document.querySelectorAll("#form [data-plans]")) e.hidden = !e.dataset.plans.split(" ").includes(plan);
  const example = $("unit").value === "example";
  for (const id of ["sampling_rate", "batch_size", "sampling", "neighbouring"]) {
    const label = $(id).closest("label");
    if (label.dataset.tabs.split(" ").includes(tab)) label.hidden = !example;
  }
  $("q").closest("label").hidden = $("adversary").value !== "collusion";
}

// ------------------------------------------------------------------ graph
async function loadGraph() {
  showError($("graph-error"), "");
  try {
    const data = await api("GET", `/api/graph?graph=${encodeURIComponent($("graph").value.trim())}`);
    renderFacts(data.facts);
  } catch (e) {
    showError($("graph-error"), e.message);
    $("facts").replaceChildren();
    $("drawing").setAttribute("hidden", "");
  }
}
async function uploadGraph(file) {
  showError($("graph-error"), "");
  try {
    if (file.size > 2_000_000) throw new Error(`${file.name}: ${file.size} bytes; at most 2 MB are accepted`);
    const text = await file.text();
    const data = await api("POST", "/api/upload", { filename: file.name, text });
    $("graph").value = data.graph;
    renderFacts(data.facts);
  } catch (e) {
    showError($("graph-error"), e.message);
  } finally {
    $("upload").value = "";
  }
}
function renderFacts(f) {
  const rows = [["name", f.name], ["nodes n", f.n], ["edges", f.edges], ["connected", f.connected],
    ["degree min / mean / max", `${f.degree_min} / ${fmt(f.degree_mean)} / ${f.degree_max}`],
    ["algebraic connectivity a(G)", fmt(f.algebraic_connectivity)]];
  if (f.mixing && f.mixing.spectral_gap !== undefined) {
    rows.push(["spectral gap (metropolis W)", fmt(f.mixing.spectral_gap)]);
    rows.push(["consensus rate", fmt(f.mixing.consensus_rate)]);
  }
  if (f.degree_histogram) rows.push(["degrees (degree: count)", Object.entries(f.degree_histogram).map(([d, c]) => `${d}: ${c}`).join(", ")]);
  $("facts").replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "num", id: `fact-${k.split(" ")[0]}` }, String(v)))));
  const svg = $("drawing");
  svg.replaceChildren();
  if (!f.drawing) { svg.setAttribute("hidden", ""); return; }
  const NS = "http://www.w3.org/2000/svg";
  const P = (v) => 12 + v * 296;
  const r = f.n > 100 ? 2 : f.n > 30 ? 3.5 : 6;
  for (const [u, v] of f.drawing.edges) {
    const l = document.createElementNS(NS, "line");
    const [a, b] = [f.drawing.xy[u], f.drawing.xy[v]];
    l.setAttribute("x1", P(a[0])); l.setAttribute("y1", P(a[1]));
    l.setAttribute("x2", P(b[0])); l.setAttribute("y2", P(b[1]));
    l.setAttribute("stroke", "#9aa5b1"); l.setAttribute("stroke-width", f.n > 100 ? 0.5 : 1);
    svg.append(l);
  }
  f.drawing.xy.forEach(([x, y], i) => {
    const c = document.createElementNS(NS, "circle");
    c.setAttribute("cx", P(x)); c.setAttribute("cy", P(y)); c.setAttribute("r", r);
    c.setAttribute("fill", "#2457a6");
    const t = document.createElementNS(NS, "title"); t.textContent = `node ${i}`; c.append(t);
    svg.append(c);
  });
  svg.removeAttribute("hidden");
}

// ------------------------------------------------------------------ jobs
async function run() {
  showError($("error"), "");
  if (currentJob) await cancel();
  history.replaceState(null, "", permalink());
  $("permalink").href = permalink();
  $("run").disabled = true;
  $("status").textContent = "sending";
  try {
    const job = await api("POST", "/api/jobs", { kind: tab, params: paramsFor(tab) });
    currentJob = job.id;
    $("run").disabled = false;  // a new Compute cancels this job and starts another
    $("cancel").disabled = false;
    poll(job.id, tab);
  } catch (e) {
    showError($("error"), e.message);
    $("status").textContent = "";
    $("run").disabled = false;
  }
}
function poll(id, kind) {
  clearTimeout(pollTimer);
  pollTimer = setTimeout(async () => {
    if (currentJob !== id) return;
    let job;
    try { job = await api("GET", `/api/jobs/${id}`); } catch (e) { finish(); showError($("error"), e.message); return; }
    if (currentJob !== id) return;
    $("progress").value = job.progress;
    $("status").textContent = job.message;
    if (job.state === "done") {
      finish();
      $("status").textContent = `done in ${job.seconds.toFixed(2)} s`;
      render(kind, job.result, id);
    } else if (job.state === "error") {
      finish();
      $("status").textContent = "";
      showError($("error"), job.error);
    } else if (job.state === "cancelled") {
      finish();
      $("status").textContent = "cancelled";
    } else poll(id, kind);
  }, 120);
}
function finish() {
  currentJob = null;
  $("run").disabled = false;
  $("cancel").disabled = true;
}
async function cancel() {
  const id = currentJob;
  if (!id) return;
  finish();
  $("status").textContent = "cancelled";
  try { await api("POST", `/api/jobs/${id}/cancel`); } catch (e) { /* already gone */ }
}

// ------------------------------------------------------------------ results
function headline(eps, label, id, extra = "") {
  return el("div", {}, el("span", { class: "eps" }, `${extra}ε = `,
    el("span", { id, "data-value": String(eps) }, fmt(eps))), el("div", { class: "label", id: `${id}-label` }, label));
}
function compareTable(rows) {
  return table(["accountant", "epsilon", "delta", "certified", "tightest", "note"], rows.map((r) =>
    el("tr", {}, el("td", {}, r.accountant), numCell(r.epsilon, `cmp-${r.accountant}`), el("td", { class: "num" }, fmt(r.delta)),
      el("td", {}, r.certified ? "yes" : (r.epsilon !== null ? "NOMINAL" : "–")), el("td", {}, r.tightest ? "*" : ""),
      el("td", {}, r.note))), { id: "compare" });
}
function warnings(list) {
  return el("div", {}, ...(list || []).map((w) => el("p", { class: "warn" }, `warning: ${w}`)));
}
function render(kind, r, jobId) {
  const head = $("headline"), tables = $("tables"), charts = $("charts");
  head.replaceChildren(); tables.replaceChildren(); charts.replaceChildren();
  if (kind === "decor") {
    head.append(headline(r.epsilon, r.label, "decor-epsilon"), warnings(r.warnings));
    const names = Object.keys(r.threat_models);
    tables.append(el("h3", {}, "Every threat model (same noise, graph and steps)"),
      table(["threat model", "epsilon", "label"], names.map((t) => el("tr", { class: t === r.adversary ? "asked" : "", id: `tm-${t}` },
        el("td", {}, t), numCell(r.threat_models[t].epsilon, `eps-${t}`), el("td", {}, r.threat_models[t].label)))));
    tables.append(el("h3", {}, `Every accountant for ${r.adversary} (* = tightest certified)`), compareTable(r.compare));
    charts.append(chart("epsilon vs steps", names.filter((t) => r.threat_models[t].curve).map((t) => ({ name: t, xs: r.threat_models[t].curve.steps, ys: r.threat_models[t].curve.epsilons })), "steps T", "epsilon", true, true));
    charts.append(...curveCharts(r.curves));
  } else if (kind === "dpsgd") {
    head.append(headline(r.epsilon, r.label, "dpsgd-epsilon"));
    tables.append(el("h3", {}, "Every accountant side by side (* = tightest certified)"), compareTable(r.compare));
    charts.append(chart("epsilon vs steps", [{ name: r.accountant, xs: r.curve_steps.steps, ys: r.curve_steps.epsilons }], "steps", "epsilon", true, true));
    charts.append(...curveCharts(r.curves));
  } else if (kind === "calibrate-decor") {
    head.append(el("div", {}, el("span", { class: "eps" }, "sigma_cor = ", el("span", { id: "cal-sigma-cor", "data-value": String(r.sigma_cor) }, fmt(r.sigma_cor)))),
      headline(r.epsilon_achieved, r.label, "cal-decor-epsilon", "achieved "), warnings(r.warnings));
    tables.append(kv(r));
  } else if (kind === "calibrate-dpsgd") {
    head.append(el("div", {}, el("span", { class: "eps" }, "noise multiplier z = ", el("span", { id: "cal-z", "data-value": String(r.noise_multiplier) }, fmt(r.noise_multiplier)))),
      headline(r.epsilon_achieved, r.label, "cal-dpsgd-epsilon", "achieved "));
    tables.append(kv(r));
  } else if (kind === "plan") {
    if (r.nominal && r.accounted) {
      head.append(el("div", {}, el("span", { class: "eps" }, "nominal ε = ",
        el("span", { id: "plan-eps-nominal", "data-value": String(r.nominal.epsilon) }, fmt(r.nominal.epsilon))),
        " (the paper's claim: NOT a guarantee)"),
        headline(r.accounted.epsilon, `accounted: ${r.accounted.accountant}, delta = ${fmt(r.accounted.delta)}, ${r.accounted.unit}-level, ${r.accounted.neighbouring}`, "plan-eps-accounted", "accounted "));
    }
    const rows = [];
    for (const key of ["nominal", "accounted"]) {
      if (r[key] && r[key].epsilon !== undefined) rows.push(el("tr", { id: `plan-${key}` }, el("td", {}, key), numCell(r[key].epsilon), el("td", {}, r[key].accountant), el("td", {}, r[key].notes || "")));
    }
    for (const [key, b] of Object.entries(r.comparisons || {})) rows.push(el("tr", {}, el("td", {}, key), numCell(b.epsilon), el("td", {}, b.accountant), el("td", {}, b.notes || "")));
    tables.append(el("h3", {}, "The paper's nominal epsilon beside the accounted one"), table(["", "epsilon", "accountant", "notes"], rows), kv(r));
  }
  $("dl-json").href = `/api/jobs/${jobId}/download?format=json`;
  $("dl-csv").href = `/api/jobs/${jobId}/download?format=csv`;
  $("results").hidden = false;
}
function kv(obj) {
  const rows = Object.entries(obj).filter(([, v]) => v === null || typeof v !== "object")
    .map(([k, v]) => el("tr", {}, el("th", {}, k), numCell(v, `kv-${k}`)));
  return table(["quantity", "value"], rows, { class: "kv" });
}
function curveCharts(c) {
  if (!c) return [];
  const ed = c.epsilon_delta, to = c.tradeoff;
  return [chart("epsilon vs delta", [{ name: "epsilon(delta)", xs: ed.deltas, ys: ed.epsilons }], "delta", "epsilon", true, false),
          chart(`trade-off curve (${to.kind})`, [{ name: "beta(alpha)", xs: to.alphas, ys: to.betas }, { name: "perfect privacy: 1 - alpha", xs: [0, 1], ys: [1, 0] }], "alpha (type I error)", "beta (type II error)", false, false)];
}
function chart(title, lines, xlabel, ylabel, logx, logy) {
  const NS = "http://www.w3.org/2000/svg", W = 480, H = 280, L = 58, R = 12, T = 12, B = 40;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const tx = (v) => (logx ? Math.log10(v) : v), ty = (v) => (logy ? Math.log10(v) : v);
  const pts = lines.map((l) => l.xs.map((x, i) => [x, l.ys[i]]).filter(([x, y]) => typeof y === "number" && isFinite(y) && (!logx || x > 0) && (!logy || y > 0)));
  const all = pts.flat();
  if (!all.length) return el("div", { class: "chart" }, el("h3", {}, title), "no finite values");
  let [x0, x1] = [Math.min(...all.map((p) => tx(p[0]))), Math.max(...all.map((p) => tx(p[0])))];
  let [y0, y1] = [Math.min(...all.map((p) => ty(p[1]))), Math.max(...all.map((p) => ty(p[1])))];
  if (!logy) y0 = Math.min(0, y0);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + 1;
  const sx = (v) => L + ((tx(v) - x0) / (x1 - x0)) * (W - L - R), sy = (v) => H - B - ((ty(v) - y0) / (y1 - y0)) * (H - T - B);
  const add = (tag, attrs, text) => { const e = document.createElementNS(NS, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; svg.append(e); return e; };
  add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888" });
  add("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#888" });
  for (let k = 0; k <= 4; k++) {
    const xv = x0 + (k / 4) * (x1 - x0), yv = y0 + (k / 4) * (y1 - y0);
    const xs = logx ? 10 ** xv : xv, ys = logy ? 10 ** yv : yv;
    add("text", { x: L + (k / 4) * (W - L - R), y: H - B + 14, "font-size": 10, "text-anchor": "middle" }, fmt(Number(xs.toPrecision(2))));
    add("text", { x: L - 4, y: H - B - (k / 4) * (H - T - B) + 3, "font-size": 10, "text-anchor": "end" }, fmt(Number(ys.toPrecision(3))));
  }
  add("text", { x: (L + W - R) / 2, y: H - 6, "font-size": 11, "text-anchor": "middle" }, xlabel + (logx ? " (log)" : ""));
  add("text", { x: 12, y: (T + H - B) / 2, "font-size": 11, "text-anchor": "middle", transform: `rotate(-90 12 ${(T + H - B) / 2})` }, ylabel + (logy ? " (log)" : ""));
  pts.forEach((p, i) => {
    if (!p.length) return;
    add("polyline", { points: p.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "), fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 2 });
  });
  const legend = el("div", { class: "legend" }, ...lines.map((l, i) => el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), l.name)));
  return el("div", { class: "chart" }, el("h3", {}, title), svg, legend);
}

// ------------------------------------------------------------------ start
function start() {
  for (const id of formIds()) defaults[id] = $(id).value;
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => { selectTab(b.dataset.tab); $("permalink").href = permalink(); });
  $("run").addEventListener("click", run);
  $("cancel").addEventListener("click", cancel);
  $("load-graph").addEventListener("click", loadGraph);
  $("graph").addEventListener("change", loadGraph);
  $("upload").addEventListener("change", (e) => { if (e.target.files.length) uploadGraph(e.target.files[0]); });
  for (const id of ["plan", "unit", "adversary"]) $(id).addEventListener("change", updateVisibility);
  for (const id of formIds()) $(id).addEventListener("keydown", (e) => { if (e.key === "Enter" && id !== "graph") run(); });
  selectTab("decor");
  const fromLink = restore();
  api("GET", "/api/limits").then((d) => { $("version").textContent = `privdl ${d.version}; at most ${d.limits.nodes} nodes, ${d.limits.steps} steps`; }).catch(() => {});
  loadGraph();
  if (fromLink) run();
}
start();
