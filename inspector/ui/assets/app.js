// gpushare live map: draws the view the server pushes (GET /api/events), and
// runs fit on a pasted manifest (POST /api/fit). No framework, no build step,
// nothing fetched from elsewhere.
"use strict";

const MAX_NODES = 300; // nodes drawn at once; refine the search for others
const state = { view: null, search: "", namespace: "", group: "none", scheduled: false };

const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// colour gives each namespace a stable hue.
function colour(ns) {
  let h = 0;
  for (let i = 0; i < ns.length; i++) h = (h * 31 + ns.charCodeAt(i)) >>> 0;
  return "hsl(" + (h % 360) + ", 55%, 55%)";
}

function fmt(v) {
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

function unitMiB(unit) {
  if (unit === "GiB") return 1024;
  if (unit === "MiB") return 1;
  const m = /^(\d+)MiB$/.exec(unit || "");
  return m ? Number(m[1]) : 1024;
}

// matches reports whether the search names the node, or a pod on it.
function nodeMatches(node, q) {
  if (!q) return true;
  if (node.name.toLowerCase().includes(q)) return true;
  return (node.pods || []).some((p) => (p.namespace + "/" + p.name).toLowerCase().includes(q));
}

function podHit(p, q) {
  return q !== "" && (p.namespace + "/" + p.name).toLowerCase().includes(q);
}

function groupOf(node, skipped) {
  switch (state.group) {
    case "mode": return node.mode === "dra" ? "DRA nodes" : "device-plugin nodes";
    case "health": {
      const bad = node.gpus.some((g) => !g.healthy) || (skipped[node.name] || []).length > 0;
      return bad ? "with unhealthy or skipped GPUs" : "all GPUs healthy";
    }
    case "room": {
      const free = node.total - node.allocated;
      if (free === 0) return "full";
      return free * 4 <= node.total ? "under a quarter free" : "room left";
    }
  }
  return "";
}

function drawGPU(node, g, pods, mib, q) {
  const row = el("div", "gpu" + (g.healthy ? "" : " unhealthy"));
  row.dataset.gpu = g.index;
  row.dataset.total = g.total;
  row.dataset.allocated = g.allocated;
  const label = el("span", "gpu-label", "GPU" + g.index);
  if (g.isolation) label.title = "tier " + g.isolation + (g.isolationReason ? ": " + g.isolationReason : "");
  row.appendChild(label);
  const bar = el("div", "bar");
  bar.title = (g.model || "GPU") + (g.healthy ? "" : " — unhealthy: " + (g.reason || "")) + (g.isolation ? " — tier " + g.isolation : "");
  for (const p of pods) {
    const share = (p.gpus || []).find((c) => c.index === g.index);
    if (!share || g.total === 0) continue;
    const b = el("div", "pod");
    b.dataset.pod = p.namespace + "/" + p.name;
    b.dataset.units = share.units;
    b.style.width = (100 * share.units / g.total) + "%";
    b.style.background = colour(p.namespace);
    if (state.namespace && p.namespace !== state.namespace) b.classList.add("faded");
    if (podHit(p, q)) b.classList.add("hit");
    let tip = p.namespace + "/" + p.name + ": " + share.units + " " + state.view.report.unit;
    const used = podUsedOn(p, g.index);
    if (used !== null) {
      const slice = share.units * mib;
      const u = el("div", "used" + (used > slice ? " over" : ""));
      u.style.width = Math.min(100, 100 * used / slice) + "%";
      b.appendChild(u);
      tip += ", using " + fmt(used / mib) + (used > slice ? " (over its slice)" : "");
    }
    b.title = tip;
    bar.appendChild(b);
  }
  row.appendChild(bar);
  let figs = g.allocated + "/" + g.total;
  if (g.usedMiB !== undefined) figs += " · " + fmt(g.usedMiB / mib) + " used";
  row.appendChild(el("span", "gpu-figs", figs));
  row.appendChild(el("span", "tier", g.isolation || ""));
  return row;
}

// podUsedOn is what a pod's containers use on GPU index, in MiB, spread
// evenly over a multi-GPU container's GPUs; null when unknown.
function podUsedOn(p, index) {
  let total = null;
  for (const c of p.containers || []) {
    if (c.usedMiB === undefined) continue;
    const gpus = c.gpus || (c.gpu !== undefined ? [c.gpu] : []);
    if (!gpus.includes(index)) continue;
    total = (total || 0) + c.usedMiB / gpus.length;
  }
  return total;
}

function drawNode(node, skipped, mib, q) {
  const s = el("article", "node");
  s.dataset.node = node.name;
  s.dataset.total = node.total;
  s.dataset.allocated = node.allocated;
  if (q && node.name.toLowerCase().includes(q)) s.classList.add("match");
  const head = el("div", "node-head");
  head.appendChild(el("span", "node-name", node.name));
  head.appendChild(el("span", "badge" + (node.mode === "dra" ? " dra" : ""), node.mode === "dra" ? "DRA" : "device plugin"));
  const bad = node.gpus.filter((g) => !g.healthy).length;
  if (bad) head.appendChild(el("span", "badge bad", bad + " unhealthy"));
  const mig = skipped[node.name] || [];
  if (mig.length) head.appendChild(el("span", "badge mig", mig.length + " skipped (MIG)"));
  let alloc = node.allocated + "/" + node.total + " " + state.view.report.unit;
  if (node.usage) alloc += " · " + fmt(node.usage.slicedMiB / mib) + " used";
  head.appendChild(el("span", "node-alloc", alloc));
  s.appendChild(head);
  const pods = node.pods || [];
  for (const g of node.gpus) s.appendChild(drawGPU(node, g, pods, mib, q));
  for (const m of mig) {
    const row = el("div", "gpu skipped");
    row.appendChild(el("span", "gpu-label", "GPU" + m.index));
    const bar = el("div", "bar");
    bar.title = m.reason;
    row.appendChild(bar);
    row.appendChild(el("span", "gpu-figs", "skipped"));
    row.appendChild(el("span", "tier", "MIG"));
    s.appendChild(row);
  }
  const unplaced = pods.filter((p) => p.pending);
  if (unplaced.length) {
    const u = el("div", "unplaced", "bound without a GPU: " + unplaced.map((p) => p.namespace + "/" + p.name).join(", "));
    s.appendChild(u);
  }
  return s;
}

function drawTotals(r) {
  const t = $("totals");
  t.textContent = "";
  const a = el("span", "", "Allocated ");
  const alloc = el("b", "", String(r.allocated));
  alloc.id = "allocated";
  const total = el("b", "", String(r.total));
  total.id = "total";
  a.append(alloc, " / ", total, " " + r.unit + " (" + r.allocatedPercent + "%) on " + r.nodes.length + " nodes");
  t.appendChild(a);
  if (r.usage) {
    const mib = unitMiB(r.unit);
    t.append(" · used " + fmt(r.usage.usedMiB / mib) + " of " + fmt(r.usage.allocatedMiB / mib) + " on " + r.usage.nodes +
      " measuring" + (r.usage.overSlice ? ", " + r.usage.overSlice + " over their slice" : ""));
  }
}

function drawLegend(r) {
  const counts = new Map();
  for (const n of r.nodes) for (const p of n.pods || []) counts.set(p.namespace, (counts.get(p.namespace) || 0) + p.units);
  const names = [...counts.keys()].sort();
  const sel = $("namespace");
  const keep = sel.value;
  sel.textContent = "";
  sel.appendChild(new Option("all", ""));
  for (const ns of names) sel.appendChild(new Option(ns, ns));
  sel.value = names.includes(keep) ? keep : "";
  state.namespace = sel.value;
  const legend = $("legend");
  legend.textContent = "";
  for (const ns of names.slice(0, 24)) {
    const s = el("span");
    const i = el("i");
    i.style.background = colour(ns);
    s.append(i, ns + " " + counts.get(ns));
    legend.appendChild(s);
  }
}

function drawPending(v) {
  const ul = $("pending");
  ul.textContent = "";
  if (v.pending.length === 0) ul.appendChild(el("li", "reason", "none"));
  for (const p of v.pending) {
    const li = el("li");
    li.dataset.pending = p.namespace + "/" + p.name;
    li.appendChild(el("span", "pod-name", p.namespace + "/" + p.name));
    if (p.request) li.append(" asks " + p.request);
    const why = el("div", "reason", p.reason || p.error || "(reason computed for the oldest " + v.pending.length + " only)");
    li.appendChild(why);
    for (const h of p.help || []) li.appendChild(el("div", "reason", "→ " + h));
    ul.appendChild(li);
  }
}

function draw() {
  state.scheduled = false;
  const v = state.view;
  if (!v) return;
  const t0 = performance.now();
  const r = v.report;
  const mib = unitMiB(r.unit);
  const skipped = v.skippedGPUs || {};
  const q = state.search.trim().toLowerCase();
  drawTotals(r);
  const matching = r.nodes.filter((n) => nodeMatches(n, q));
  const shown = matching.slice(0, MAX_NODES);
  const map = $("map");
  const frag = document.createDocumentFragment();
  const groups = new Map();
  for (const n of shown) {
    const g = groupOf(n, skipped);
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(n);
  }
  for (const [g, nodes] of [...groups.entries()].sort()) {
    if (g) frag.appendChild(el("div", "group-title", g + " (" + nodes.length + ")"));
    for (const n of nodes) frag.appendChild(drawNode(n, skipped, mib, q));
  }
  map.textContent = "";
  map.appendChild(frag);
  $("shown").textContent = matching.length > shown.length
    ? "showing " + shown.length + " of " + matching.length + " nodes: refine the search"
    : matching.length + " of " + r.nodes.length + " nodes";
  drawPending(v);
  window.gpushareRendered = { generation: v.generation, ms: performance.now() - t0 };
}

function schedule() {
  if (!state.scheduled) {
    state.scheduled = true;
    requestAnimationFrame(draw);
  }
}

function show(v) {
  const first = !state.view;
  state.view = v;
  if (first || v.report.nodes.length) drawLegend(v.report);
  schedule();
}

function connect() {
  const es = new EventSource("api/events");
  es.addEventListener("view", (e) => {
    $("status").dataset.state = "live";
    $("status").textContent = "live";
    show(JSON.parse(e.data));
  });
  es.onerror = () => {
    $("status").dataset.state = "reconnecting";
    $("status").textContent = "reconnecting";
  };
}

async function runFit(e) {
  e.preventDefault();
  const out = $("fit-out");
  out.classList.remove("error");
  out.textContent = "…";
  const replicas = Math.max(1, Number($("replicas").value) || 1);
  try {
    const resp = await fetch("api/fit?replicas=" + replicas, { method: "POST", body: $("manifest").value, headers: { "Content-Type": "application/yaml" } });
    const body = await resp.text();
    if (!resp.ok) {
      out.classList.add("error");
      out.textContent = body;
      return;
    }
    out.textContent = JSON.parse(body).text;
  } catch (err) {
    out.classList.add("error");
    out.textContent = String(err);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("search").addEventListener("input", (e) => { state.search = e.target.value; schedule(); });
  $("namespace").addEventListener("change", (e) => { state.namespace = e.target.value; schedule(); });
  $("group").addEventListener("change", (e) => { state.group = e.target.value; schedule(); });
  $("fit").addEventListener("submit", runFit);
  connect();
});
