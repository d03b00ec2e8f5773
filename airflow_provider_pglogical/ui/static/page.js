// The pipeline view: reads api/pipelines (the Airflow login's cookie goes with it) and draws each
// pipeline's figures, tables and two small SVG charts. No build step, no library.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
  children.flat().forEach(c => node.append(c instanceof Node ? c : document.createTextNode(c ?? "")));
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  return s < 120 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min";
}

function when(iso) { return iso ? new Date(iso).toLocaleString() : "never"; }

function figure(label, value) { return el("div", {class: "figure"}, el("b", {}, value), el("span", {}, label)); }

// A line chart of points [{t, v}] as inline SVG, with its title and the newest value.
function chart(title, points, format, cls) {
  const w = 360, h = 120, pad = 28;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "chart " + cls);
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  svg.setAttribute("role", "img"); svg.setAttribute("aria-label", title);
  const text = (x, y, s, anchor) => {
    const t = document.createElementNS(SVG, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor || "start");
    t.textContent = s; svg.append(t);
  };
  text(4, 12, title + (points.length ? " (now " + format(points[points.length - 1].v) + ")" : " (no data yet)"));
  if (points.length) {
    const t0 = points[0].t, t1 = Math.max(points[points.length - 1].t, t0 + 1);
    const vmax = Math.max(...points.map(p => p.v), 1e-9);
    const x = t => pad + (w - 2 * pad) * (t - t0) / (t1 - t0);
    const y = v => h - 16 - (h - 40) * v / vmax;
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.map(p => x(p.t).toFixed(1) + "," + y(p.v).toFixed(1)).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#2f6fd6"); line.setAttribute("stroke-width", "2");
    svg.append(line);
    points.forEach(p => {
      const dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("cx", x(p.t)); dot.setAttribute("cy", y(p.v)); dot.setAttribute("r", 2.5);
      dot.setAttribute("fill", "#2f6fd6"); svg.append(dot);
    });
    text(pad - 4, 26, format(vmax), "end");
    text(pad, h - 3, new Date(t0).toLocaleTimeString());
    text(w - pad, h - 3, new Date(t1).toLocaleTimeString(), "end");
  }
  return svg;
}

function pipelineCard(p) {
  const health = p.slot_health || {};
  const bad = p.staging_error || p.slot_error || ["missing", "invalidated", "breach"].includes(health.state)
    || (health.warnings || []).length > 0;
  const card = el("section", {class: "pipeline", "data-pipeline": p.pipeline},
    el("h2", {}, p.pipeline + " ", el("span", {class: "state" + (bad ? " bad" : "")},
      (p.state || "unknown") + (health.state ? " · slot " + health.state : ""))),
    el("div", {class: "muted"}, "slot " + (p.slot || "–") + " · staging " + p.staging_root + " · DAGs " + p.dags.join(", ")));
  [p.staging_error, p.slot_error].filter(Boolean).forEach(e => card.append(el("div", {class: "error"}, e)));
  if (health.message && health.state !== "ok") card.append(el("div", {class: "error"}, health.message));
  (health.warnings || []).forEach(w => card.append(el("div", {class: "warning"}, "Before the slot is lost: " + w)));
  const last = p.last_pull || {}, applied = p.last_apply || {};
  card.append(el("div", {class: "figures"},
    figure("slot lag", bytes(health.lag_bytes)),
    figure("retained WAL", bytes(health.retained_wal_bytes)),
    figure("WAL headroom (max_slot_wal_keep_size " + (!p.slot_health ? "–" : health.max_slot_wal_keep_size_bytes == null
             ? "unlimited" : bytes(health.max_slot_wal_keep_size_bytes)) + ")",
           !p.slot_health ? "–" : health.safe_wal_size_bytes == null ? "unlimited" : bytes(health.safe_wal_size_bytes)),
    figure("invalidation reason", !p.slot_health ? "–" : health.invalidation_reason || "none"),
    figure("pending batches", String(p.pending_batches ?? "–")),
    figure("pending rows", (p.pending_rows ?? "–") + (p.pending_rows_exact === false ? "+" : "")),
    figure("last pull: " + when(last.at), last.at ? `${last.rows} rows in ${seconds(last.seconds)}` : "–"),
    figure("last apply: " + when(applied.at), applied.at ? `${applied.rows} rows in ${seconds(applied.seconds)}` : "–"),
  ));
  const load = p.initial_load;  // a chunked initial load: staged so far, of PostgreSQL's estimate at its start
  if (load) card.querySelector(".figures").append(figure("chunked initial load" + (load.complete ? ": complete" : ""),
    `${load.rows} ${load.estimated_rows ? "of ~" + load.estimated_rows + " " : ""}rows in ${load.chunks} chunks · ` +
    `${load.tables_done}/${load.tables} tables` + (load.tables_whole ? ` (${load.tables_whole} loaded whole)` : "")
    + (load.estimated_rows && !load.complete
      ? ` (${Math.min(100, Math.floor(100 * load.rows / load.estimated_rows))}%)` : "")));
  if (p.last_error) card.append(el("div", {class: "error"}, "Last error (" + when(p.last_error.at) + "): " + p.last_error.error));
  const change = p.last_source_change;  // a change to what the source publishes (issue 47)
  if (change) card.append(el("div", {class: "warning"}, "Source change (" + when(change.at) + "): " +
    [...Object.entries(change.resnapshotted || {}).map(([t, why]) => t + " snapshotted again: " + why),
     ...Object.entries(change.orphaned || {}).map(([t, why]) => t + " orphaned: " + why)].join("; ")));
  if (p.tables && p.tables.length) {
    card.append(el("table", {class: "tables"},
      el("tr", {}, ["table", "Iceberg table", "applied up to", "applied at", "rows", "freshness"].map(h => el("th", {}, h))),
      p.tables.map(t => el("tr", {"data-table": t.table},
        el("td", {}, t.table), el("td", {}, t.target || "–"), el("td", {}, t.applied_lsn || "not applied yet"),
        el("td", {}, t.applied_at ? when(t.applied_at) : "–"), el("td", {}, t.applied_rows ?? "–"),
        el("td", {}, seconds(t.freshness_seconds))))));
  }
  const hist = p.history || {slot_lag: [], freshness: []};
  card.append(el("div", {class: "charts"},
    chart("Slot lag", hist.slot_lag.filter(e => e.lag_bytes != null).map(e => ({t: Date.parse(e.at), v: e.lag_bytes})), bytes, "lag"),
    chart("Freshness (commit to queryable)", hist.freshness.map(e => ({t: Date.parse(e.at), v: e.seconds})), seconds, "freshness")));
  return card;
}

async function load() {
  const status = document.getElementById("status");
  const response = await fetch("api/pipelines", {credentials: "same-origin"});
  if (response.status === 401 || response.status === 403) {
    status.textContent = "";
    status.append("Log in to Airflow to see the pipelines: ", el("a", {href: "/"}, "open Airflow"));
    return;
  }
  if (!response.ok) { status.textContent = "Could not load the pipelines: HTTP " + response.status; return; }
  const data = await response.json();
  const list = document.getElementById("pipelines");
  list.replaceChildren(...data.pipelines.map(pipelineCard));
  status.textContent = data.pipelines.length
    ? data.pipelines.length + " pipeline(s) · as of " + when(data.generated_at)
    : "No pipelines in the DAGs you may read.";
  document.body.setAttribute("data-loaded", "true");
}

load().catch(err => { document.getElementById("status").textContent = "Could not load the pipelines: " + err; });
