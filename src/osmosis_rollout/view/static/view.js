// osmosis view: the rollout table, one rollout as a transcript, two side by side.
// Plain JavaScript, no build step, nothing fetched from elsewhere: it must work offline.
"use strict";

const state = { rollouts: null, byId: new Map(), cache: new Map() };
const MAX_ROWS = 2000; // rows drawn at once; the filters narrow the rest
const SORTS = {
  row: (r) => (r.row === null ? Infinity : r.row),
  time: (r) => r.latency_ms,
  turns: (r) => r.turns,
  tokens: (r) => r.tokens,
  reward: (r) => (r.reward === null ? -Infinity : r.reward),
};

// A path's last two parts: enough to tell run-a/results.jsonl from run-b/results.jsonl.
const short = (path) => String(path ?? "").split(/[\\/]/).filter(Boolean).slice(-2).join("/");

// -- the one way values reach the page ----------------------------------------------------
// Every value from a results file or trace is untrusted (a crafted trace is a web page's worth
// of HTML). Markup is written only with the html`...` tag, which escapes every interpolated
// value unless it is itself an html`...` fragment (or an array of them), and only render()
// puts a fragment into the page. The server's Content-Security-Policy lets no inline script
// run and, with Trusted Types, makes innerHTML refuse any string that did not come through
// render(). New columns and views get escaping by using html`` too.

class Html {
  constructor(text) { this.text = text; }
  toString() { return this.text; }
}

function escapeText(value) {
  return String(value ?? "").replace(/[&<>"'`]/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "`": "&#96;",
  })[c]);
}

// A value as an escaped fragment: the same as interpolating it into html``, never escaped twice.
const esc = (value) => new Html(escapeText(value));

function piece(value) {
  if (value instanceof Html) return value.text;
  if (Array.isArray(value)) return value.map(piece).join("");
  return escapeText(value);
}

function html(strings, ...values) {
  let text = strings[0];
  values.forEach((value, i) => { text += piece(value) + strings[i + 1]; });
  return new Html(text);
}

const policy = window.trustedTypes
  ? window.trustedTypes.createPolicy("osmosis-view", { createHTML: (text) => text })
  : null;

// Draw a fragment into an element; then what markup may not carry (styles) is set as properties.
function render(element, fragment) {
  if (!(fragment instanceof Html)) throw new TypeError("render() takes an html`` fragment");
  element.innerHTML = policy ? policy.createHTML(fragment.text) : fragment.text;
  for (const bar of element.querySelectorAll("[data-left]")) {
    bar.style.left = `${Number(bar.dataset.left)}%`;
    bar.style.width = `${Number(bar.dataset.width)}%`;
  }
}

// Fragments separated by a space (badges, links).
const joined = (fragments) => fragments.flatMap((f, i) => (i ? [html` `, f] : [f]));

// A number as the page shows it; anything else (a crafted file's string) as text, escaped later.
const count = (value) => (value === null || value === undefined ? "-" : value);

function ms(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value !== "number") return String(value);
  if (value >= 1000) return (value / 1000).toFixed(2) + " s";
  return value.toFixed(value >= 10 ? 0 : 1) + " ms";
}

function statusBadge(status) {
  // UNKNOWN: an ATIF trajectory from another producer, which records no outcome.
  const kind = status === "COMPLETED" ? "ok" : status === "SKIPPED" || status === "UNKNOWN" ? "dim" : "bad";
  return html`<span class="badge ${kind}">${status}</span>`;
}

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.detail || `HTTP ${response.status}`);
  return body;
}

async function loadIndex() {
  if (state.rollouts) return;
  const body = await getJSON("/api/rollouts");
  state.rollouts = body.rollouts;
  for (const r of body.rollouts) state.byId.set(r.id, r);
  const warn = body.warnings.length ? ` · ${body.warnings.length} warning(s)` : "";
  const sources = document.getElementById("sources");
  sources.textContent = body.sources.map(short).join(", ") + warn;
  sources.title = body.sources.join("\n");
  state.warnings = body.warnings;
}

async function loadRollout(id) {
  if (!state.cache.has(id)) state.cache.set(id, await getJSON(`/api/rollouts/${encodeURIComponent(id)}`));
  return state.cache.get(id);
}

// -- routing ---------------------------------------------------------------------------------

function parseHash() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

async function route() {
  const app = document.getElementById("app");
  try {
    await loadIndex();
    const { parts, params } = parseHash();
    if (parts[0] === "rollout" && parts[1]) {
      await showRollout(app, parts[1]);
    } else if (parts[0] === "compare" && parts[1] && parts[2]) {
      await showCompare(app, parts[1], parts[2]);
    } else {
      showList(app, params);
    }
  } catch (error) {
    render(app, html`<p class="error">Could not load: ${error.message}</p>`);
  }
  document.body.dataset.ready = "1";
}

window.addEventListener("hashchange", route);
// The timeline's "turn N" links scroll to their turn without changing the route.
document.addEventListener("click", (event) => {
  const link = event.target instanceof Element && event.target.closest("a.tl-label[data-turn]");
  if (!link) return;
  event.preventDefault();
  document.getElementById(`turn-${link.dataset.turn}`)?.scrollIntoView();
});
window.addEventListener("DOMContentLoaded", route);

// -- the table -------------------------------------------------------------------------------

function filtersFrom(params) {
  return {
    status: params.get("status") || "",
    finding: params.get("finding") || "",
    rmin: params.get("rmin") || "",
    rmax: params.get("rmax") || "",
    q: params.get("q") || "",
    sort: SORTS[params.get("sort")] ? params.get("sort") : "row",
    dir: params.get("dir") === "desc" ? "desc" : "asc",
  };
}

function applyFilters(rollouts, f) {
  const rmin = f.rmin === "" ? null : Number(f.rmin);
  const rmax = f.rmax === "" ? null : Number(f.rmax);
  const q = f.q.toLowerCase();
  const kept = rollouts.filter((r) => {
    if (f.status && r.status !== f.status) return false;
    if (f.finding === "(any)" && !r.findings.length) return false;
    if (f.finding === "(none)" && r.findings.length) return false;
    if (f.finding && !f.finding.startsWith("(") && !r.findings.includes(f.finding)) return false;
    if (rmin !== null && !(r.reward !== null && r.reward >= rmin)) return false;
    if (rmax !== null && !(r.reward !== null && r.reward <= rmax)) return false;
    if (q && !String(r.rollout_id || "").toLowerCase().includes(q)) return false;
    return true;
  });
  const key = SORTS[f.sort];
  const sign = f.dir === "desc" ? -1 : 1;
  return kept.sort((a, b) => sign * (key(a) - key(b)) || (a.row ?? 0) - (b.row ?? 0));
}

function options(values, selected, first) {
  return (first ? [first, ...values] : values).map(([value, label]) =>
    html`<option value="${value}"${value === selected ? html` selected` : ""}>${label}</option>`);
}

function showList(app, params) {
  const f = filtersFrom(params);
  const all = state.rollouts;
  const statuses = [...new Set(all.map((r) => r.status))].sort();
  const codes = [...new Set(all.flatMap((r) => r.findings))].sort();
  const rows = applyFilters(all, f);
  const sameRow = new Map();
  for (const r of all) if (r.row !== null) sameRow.set(r.row, (sameRow.get(r.row) || 0) + 1);
  // Two runs or more: each rollout says which one (results file or trace folder) it is from.
  const manyRuns = new Set(all.map((r) => r.source)).size > 1;
  const sampled = all.some((r) => r.sample); // --samples: a column for each rollout's sample
  const shown = rows.slice(0, MAX_ROWS);
  const more = rows.length > shown.length ? ` (first ${shown.length} shown)` : "";
  const body = shown.map((r) => html`
    <tr data-id="${r.id}" data-status="${r.status}">
      <td class="num">${count(r.row)}</td>
      ${sampled ? html`<td class="num">${count(r.sample)}</td>` : ""}
      <td><a href="#/rollout/${encodeURIComponent(r.id)}">${r.rollout_id || r.id}</a>
        ${sameRow.get(r.row) > 1 ? html`<span class="dim" title="other rollouts of this row">×${sameRow.get(r.row)}</span>` : ""}</td>
      <td>${statusBadge(r.status)}</td>
      <td class="num" title="${components(r)}">${count(r.reward)}</td>
      <td class="num">${r.turns}</td>
      <td class="num">${count(r.tool_calls)}${r.tool_errors ? html` <span class="error-text" title="tool calls that raised or timed out">(${count(r.tool_errors)} err)</span>` : ""}</td>
      <td class="num">${r.tokens}</td>
      <td class="num">${ms(r.latency_ms)}</td>
      <td>${joined(r.findings.map((c) => html`<span class="badge warn">${c}</span>`))}
        ${r.error_message ? html`<span class="error-text" title="${r.error_message}">${String(r.error_message).slice(0, 80)}</span>` : ""}</td>
      ${manyRuns ? html`<td class="source" title="${r.source}">${short(r.source)}</td>` : ""}
    </tr>`);
  const warnings = (state.warnings || []).map((w) => html`<p class="warn-text">${w}</p>`);
  render(app, html`
    <form id="filters" class="filters">
      <label>Status <select id="f-status">${options(statuses.map((s) => [s, s]), f.status, ["", "all"])}</select></label>
      <label>Finding <select id="f-finding">${options([["(any)", "any finding"], ["(none)", "no finding"], ...codes.map((c) => [c, c])], f.finding, ["", "all"])}</select></label>
      <label>Reward <input id="f-rmin" type="number" step="any" placeholder="min" value="${f.rmin}">
        – <input id="f-rmax" type="number" step="any" placeholder="max" value="${f.rmax}"></label>
      <label>Rollout id <input id="f-q" type="search" placeholder="contains" value="${f.q}"></label>
      <label>Sort <select id="f-sort">${options([["row", "row"], ["time", "time"], ["turns", "turns"], ["tokens", "tokens"], ["reward", "reward"]], f.sort, null)}</select></label>
      <label><select id="f-dir">${options([["asc", "ascending"], ["desc", "descending"]], f.dir, null)}</select></label>
    </form>
    ${warnings}
    <p id="count" class="dim">${rows.length} of ${all.length} rollouts${more}</p>
    <table id="rollouts" class="rollouts">
      <thead><tr><th>row</th>${sampled ? html`<th>sample</th>` : ""}<th>rollout</th><th>status</th><th>reward</th><th>turns</th>
        <th>tools</th><th>tokens</th><th>time</th><th>findings / error</th>${manyRuns ? html`<th>source</th>` : ""}</tr></thead>
      <tbody>${body}</tbody>
    </table>`);
  document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());
  for (const id of ["f-status", "f-finding", "f-rmin", "f-rmax", "f-q", "f-sort", "f-dir"]) {
    document.getElementById(id).addEventListener("change", updateFilters);
  }
}

function updateFilters() {
  const params = new URLSearchParams();
  const values = {
    status: "f-status", finding: "f-finding", rmin: "f-rmin", rmax: "f-rmax", q: "f-q", sort: "f-sort", dir: "f-dir",
  };
  for (const [key, id] of Object.entries(values)) {
    const value = document.getElementById(id).value;
    if (value && !(key === "sort" && value === "row") && !(key === "dir" && value === "asc")) params.set(key, value);
  }
  const query = params.toString();
  location.hash = "#/" + (query ? "?" + query : "");
}

// -- one rollout -----------------------------------------------------------------------------

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (p && p.text) || "").join(" ");
  return JSON.stringify(content, null, 2);
}

function prettyArguments(raw) {
  if (typeof raw !== "string") return JSON.stringify(raw, null, 2);
  try { return JSON.stringify(JSON.parse(raw), null, 2); } catch { return raw; }
}

function toolCallView(call, traced) {
  const fn = call.function || {};
  const result = traced
    ? html`<div class="tool-result${traced.error ? html` failed` : ""}">
         <span class="label">result</span> <span class="dim">${ms(traced.latency_ms)}${traced.result_chars ? html` · cut from ${traced.result_chars} chars` : ""}</span>
         <pre>${traced.result}</pre></div>`
    : "";
  return html`<details class="tool-call" open>
      <summary><span class="tool-name">${fn.name || "?"}</span> <span class="dim">${call.id || ""}</span></summary>
      <pre class="arguments">${prettyArguments(fn.arguments)}</pre>${result}
    </details>`;
}

function itemView(item) {
  // An item that is not a chat message (a server we did not write may send the Responses
  // API's function_call / function_call_output): its type, then its call, output or JSON.
  const body = item.name !== undefined && item.arguments !== undefined
    ? `${item.name}(${contentText(item.arguments)})`
    : item.output !== undefined ? String(contentText(item.output)) : JSON.stringify(item);
  return html`<div class="msg item"><span class="role">${item.type || "item"}</span><div class="content">${body}</div></div>`;
}

function messageView(message, traced) {
  if (message && message.role === undefined) return itemView(message);
  const role = message.role || "?";
  const calls = (Array.isArray(message.tool_calls) ? message.tool_calls : []).map((c) => toolCallView(c, traced && traced.get(c.id)));
  const text = String(contentText(message.content));
  const body = text ? html`<div class="content">${text}</div>` : "";
  if (role === "tool") {
    const preview = text.length > 90 ? text.slice(0, 90) + "…" : text;
    return html`<details class="msg tool"><summary><span class="role">tool</span>
      <span class="dim">${message.tool_call_id || ""}</span> ${preview}</summary>${body}</details>`;
  }
  return html`<div class="msg ${role}"><span class="role">${role}</span>${body}${calls}</div>`;
}

function findingBadges(findings) {
  return joined(findings.map((f) => html`<span class="badge warn finding" title="${f.message}">${f.code}</span>`));
}

function timeline(trajectory, summary) {
  const turns = trajectory.turns;
  const start = trajectory.start && trajectory.start.ts;
  const end = trajectory.end && trajectory.end.ts;
  const total = start && end && end > start ? (end - start) * 1000 : Math.max(summary.latency_ms, 1);
  const span = (ts, latency) => {
    if (!start || !ts) return null;
    const left = ((ts * 1000 - latency - start * 1000) / total) * 100;
    return [Math.max(0, left), Math.max(0.4, (latency / total) * 100)];
  };
  const rows = turns.map((t) => {
    const bars = [];
    const llm = span(t.ts, t.latency_ms) || [0, Math.max(0.4, (t.latency_ms / total) * 100)];
    bars.push(html`<span class="bar llm" data-left="${llm[0]}" data-width="${llm[1]}" title="LLM ${ms(t.latency_ms)}"></span>`);
    for (const c of t.tool_calls) {
      const s = span(c.ts, c.latency_ms);
      if (s) bars.push(html`<span class="bar tool" data-left="${s[0]}" data-width="${s[1]}" title="${c.tool} ${ms(c.latency_ms)}"></span>`);
    }
    return html`<div class="tl-row"><a class="tl-label" href="#turn-${t.number}" data-turn="${t.number}">turn ${t.number}</a>
      <div class="tl-track">${bars}</div><span class="tl-ms">${ms(t.latency_ms)}</span></div>`;
  });
  return html`<div class="timeline" title="time since the rollout started: LLM calls in blue, tools in orange">${rows}
    <div class="tl-row"><span class="tl-label dim">total</span><div class="tl-scale">${ms(total)}</div></div></div>`;
}

// A trace written by the mock TrainGate (osmosis test --server/--launch --debug-dir) sees the
// wire only: its calls (the start, callbacks, status, cancel, polls) fold open to their bodies.
const fromGate = (trajectory) => Boolean(trajectory && trajectory.start && trajectory.start.side === "traingate");

function wireEventView(e) {
  const what = e.event === "callback" ? `${e.name || "?"} callback` : e.event;
  const payload = Object.fromEntries(["body", "answer"].filter((k) => e[k] !== undefined).map((k) => [k, e[k]]));
  return html`<details class="event wire" data-event="${e.event}"><summary><span class="label">${what}</span>
      ${e.path ? html` <code>${e.method || ""} ${e.path}</code>` : ""}${e.status_code !== undefined ? html` → ${e.status_code}` : ""} <span class="dim">${ms(e.latency_ms)}</span>
      ${e.error ? html` <span class="error-text">${e.error}</span>` : ""}</summary>
      <pre>${JSON.stringify(payload, null, 2)}</pre></details>`;
}

function eventView(e, wire) {
  if (wire) return wireEventView(e);
  return html`<div class="event"><span class="label">${e.event}</span> <code>${JSON.stringify(Object.fromEntries(Object.entries(e).filter(([k]) => !["v", "ts", "event", "rollout_id"].includes(k))))}</code></div>`;
}

function turnView(turn, wire) {
  const traced = new Map(turn.tool_calls.map((c) => [c.tool_call_id, c]));
  const usage = turn.usage || {};
  const reply = turn.reply ? messageView(turn.reply, traced) : "";
  const error = turn.error ? html`<p class="error-text">LLM call failed: ${turn.error}</p>` : "";
  const events = turn.events.map((e) => eventView(e, wire));
  const tools = Array.isArray(turn.tools) ? html` · tools: ${turn.tools.length ? turn.tools.join(", ") : "none"}` : "";
  return html`<section class="turn" id="turn-${turn.number}" data-turn="${turn.number}">
      <h3>Turn ${turn.number}
        <span class="dim">${turn.finish_reason || ""} · ${usage.prompt_tokens ?? "?"} in / ${usage.completion_tokens ?? "?"} out tokens · ${ms(turn.latency_ms)}${tools}</span>
        ${findingBadges(turn.findings)}</h3>
      ${turn.new_messages.map((m) => messageView(m))}
      ${reply}${error}${events}
    </section>`;
}

function rolloutView(data) {
  const s = data.summary;
  const row = data.row || {};
  const t = data.trajectory;
  const head = html`<div class="head">
      <h2>${s.rollout_id || s.id} ${statusBadge(s.status)}</h2>
      <dl class="facts">
        <div><dt>row</dt><dd>${count(s.row)}</dd></div>
        <div><dt>reward</dt><dd>${count(s.reward)}</dd></div>
        ${s.sample !== null && s.sample !== undefined ? html`<div><dt>sample</dt><dd>${count(s.sample)}</dd></div>` : ""}
        ${Object.keys(s.reward_components || {}).length ? html`<div><dt>reward parts</dt><dd>${components(s)}</dd></div>` : ""}
        ${s.tool_errors ? html`<div><dt>tool errors</dt><dd class="error-text">${count(s.tool_errors)}</dd></div>` : ""}
        <div><dt>finish</dt><dd>${s.finish_reason || "-"}</dd></div>
        <div><dt>turns</dt><dd>${s.turns}</dd></div>
        <div><dt>tokens</dt><dd>${s.prompt_tokens} in / ${s.response_tokens} out</dd></div>
        <div><dt>time</dt><dd>${ms(s.latency_ms)}</dd></div>
        ${row.ground_truth !== undefined && row.ground_truth !== null ? html`<div><dt>ground truth</dt><dd>${row.ground_truth}</dd></div>` : ""}
      </dl>
      ${s.error_message ? html`<p class="error-text">${s.error_message}</p>` : ""}
    </div>`;
  let body;
  if (t) {
    const endFindings = t.findings.filter((f) => !f.turn);
    const final = t.end && t.end.final_messages && t.end.final_messages.length
      ? html`<section class="turn final"><h3>Final messages</h3>${t.end.final_messages.map((m) => messageView(m))}</section>` : "";
    const wire = fromGate(t);
    const side = wire
      ? html`<p class="side-note">Seen from the mock TrainGate: every call that crossed the wire to and from ${t.start.server || "the server"} (protocol ${t.start.protocol || "?"}); the server's own steps, such as its tool calls, are its own to trace.</p>
        ${t.events.length ? html`<section class="turn wire-start"><h3>Before the first turn</h3>${t.events.map((e) => eventView(e, true))}</section>` : ""}`
      : "";
    body = html`${side}${timeline(t, s)}${t.turns.map((turn) => turnView(turn, wire))}${final}
      ${endFindings.length ? html`<section class="turn final"><h3>Findings ${findingBadges(endFindings)}</h3></section>` : ""}
      ${t.bad_lines ? html`<p class="warn-text">${t.bad_lines} broken line(s) in the trace were skipped</p>` : ""}`;
  } else {
    const findings = (row.findings || []).map((f) => ({ code: f.code, message: f.message }));
    body = html`<p class="dim">No trace for this rollout: run <code>osmosis test</code> with <code>--debug-dir</code> for turns, timing and tool results (with <code>--server</code> or <code>--launch</code> it keeps the mock TrainGate's side of each rollout; a server started with <code>osmosis serve --debug-dir</code> keeps its own, and its folder can be given here too).</p>
      ${findings.length ? html`<p>${findingBadges(findings)}</p>` : ""}
      <section class="turn">${(Array.isArray(row.final_messages) ? row.final_messages : []).map((m) => messageView(m))}</section>`;
  }
  return html`<div class="transcript" data-id="${s.id}">${head}${body}</div>`;
}

// "format 0.2, correct 1": a rollout's reward components, for a title or a fact.
function components(r) {
  return Object.entries(r.reward_components || {}).map(([k, v]) => `${k} ${v}`).join(", ");
}

// --samples: the rollout's group (its row's samples in the same run), side by side by reward.
function groupStrip(summary) {
  if (summary.sample === null || summary.sample === undefined || summary.row === null) return "";
  const group = state.rollouts
    .filter((r) => r.row === summary.row && r.source === summary.source && r.sample !== null)
    .sort((a, b) => a.sample - b.sample);
  if (group.length < 2) return "";
  const cells = group.map((r) => html`<a class="badge ${r.id === summary.id ? "ok" : "dim"}" href="#/rollout/${encodeURIComponent(r.id)}" title="sample ${count(r.sample)}">${count(r.sample)}: ${count(r.reward)}</a>`);
  return html`<p class="group">group of row ${count(summary.row)}: ${joined(cells)}</p>`;
}

function siblings(summary) {
  if (summary.row === null) return [];
  return state.rollouts.filter((r) => r.row === summary.row && r.id !== summary.id);
}

async function showRollout(app, id) {
  const data = await loadRollout(id);
  const others = siblings(data.summary).map((r) =>
    html`<a class="compare-link" href="#/compare/${encodeURIComponent(id)}/${encodeURIComponent(r.id)}">compare with ${r.rollout_id || r.id} (${short(r.source)})</a>`);
  render(app, html`<nav class="crumbs"><a href="#/">← all rollouts</a> ${joined(others)}</nav>${groupStrip(data.summary)}${rolloutView(data)}`);
}

async function showCompare(app, a, b) {
  const [left, right] = await Promise.all([loadRollout(a), loadRollout(b)]);
  render(app, html`<nav class="crumbs"><a href="#/">← all rollouts</a>
      <a href="#/rollout/${encodeURIComponent(a)}">only the left one</a></nav>
    <div class="compare">${rolloutView(left)}${rolloutView(right)}</div>`);
}
