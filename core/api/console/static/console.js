// The console's one script: every few seconds it reloads the page it is on and swaps in the
// live parts ([data-live]), and it draws each connector's last hour ([data-history]) as two
// small SVG charts. Requests go to the console's own routes with its cookie; nothing else.
"use strict";

const REFRESH_MS = 2000;
const HOUR = 3600;
const SVG = "http://www.w3.org/2000/svg";

async function fetchOrLogin(url) {
  const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (r.status === 401 || new URL(r.url).pathname === "/console/login") {
    window.location.assign("/console/login");
    throw new Error("logged out");
  }
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r;
}

async function refreshLive() {
  const live = document.querySelectorAll("[data-live]");
  if (!live.length) return;
  const html = await (await fetchOrLogin(window.location.href)).text();
  const fresh = new DOMParser().parseFromString(html, "text/html");
  for (const el of live) {
    const next = fresh.getElementById(el.id);
    if (next) el.replaceChildren(...next.childNodes);
  }
}

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  parent.appendChild(e);
  return e;
}

function short(n) {
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(0) + "k";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + "k";
  return n >= 10 || n === 0 ? n.toFixed(0) : n.toFixed(1);
}

function ago(seconds) {
  return seconds >= 90 ? `−${Math.round(seconds / 60)} min` : `−${Math.round(seconds)} s`;
}

// One series over the last hour (or since the first sample, when the API has run less long):
// a filled line, its latest value and its peak.
function draw(svg, samples, field, label) {
  const w = svg.clientWidth || 320, h = svg.clientHeight || 90;
  const pad = { l: 4, r: 4, t: 16, b: 14 };
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.replaceChildren();
  const now = Date.now() / 1000;
  const pts = samples.filter((s) => s.t >= now - HOUR);
  const span = Math.max(60, Math.min(HOUR, pts.length ? now - pts[0].t : HOUR));
  const peak = Math.max(1, ...pts.map((s) => s[field] || 0));
  const x = (t) => pad.l + ((t - (now - span)) / span) * (w - pad.l - pad.r);
  const y = (v) => h - pad.b - (v / peak) * (h - pad.t - pad.b);
  for (const f of [0, 0.5, 1]) {
    el("line", { x1: pad.l, x2: w - pad.r, y1: y(f * peak), y2: y(f * peak), class: "grid" }, svg);
  }
  for (const [t, text, anchor] of [[now - span, ago(span), "start"], [now - span / 2, ago(span / 2), "middle"], [now, "now", "end"]]) {
    el("text", { x: x(t), y: h - 2, "text-anchor": anchor, class: "axis" }, svg).textContent = text;
  }
  const last = pts.length ? pts[pts.length - 1][field] || 0 : 0;
  el("text", { x: pad.l, y: 11, class: "label" }, svg).textContent =
    `${label} ${short(last)}  ·  peak ${short(pts.length ? peak : 0)}`;
  if (pts.length < 2) return;
  const line = pts.map((s) => `${x(s.t).toFixed(1)},${y(s[field] || 0).toFixed(1)}`).join(" ");
  const base = `${x(pts[pts.length - 1].t).toFixed(1)},${y(0)} ${x(pts[0].t).toFixed(1)},${y(0)}`;
  el("polygon", { points: `${line} ${base}`, class: "area" }, svg);
  el("polyline", { points: line, class: "line" }, svg);
}

async function refreshCharts() {
  for (const fig of document.querySelectorAll("[data-history]")) {
    const samples = await (await fetchOrLogin(fig.dataset.history)).json();
    draw(fig.querySelector("svg.rate"), samples, "rate", "msg/s");
    draw(fig.querySelector("svg.lag"), samples, "lag_messages", "lag");
  }
}

let ticks = 0;
async function tick() {
  try {
    await refreshLive();
    if (ticks++ % 3 === 0) await refreshCharts();  // samples come every few seconds
  } catch (e) {
    console.warn(e);
  }
  setTimeout(tick, REFRESH_MS);
}

// A destructive action asks first (its form says what, in data-confirm).
document.addEventListener("submit", (e) => {
  const ask = e.target.dataset.confirm;
  if (ask && !window.confirm(ask)) e.preventDefault();
});
document.addEventListener("DOMContentLoaded", tick);
