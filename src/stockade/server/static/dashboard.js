// The stockade dashboard (docs/dashboard.md): read-only, no build step, no dependency.
// It draws the snapshots of /ui/events (server-sent events) and reconnects when the stream is cut.
"use strict";

const scopePage = document.body.dataset.scope || "";
const state = { q: "", page: 0, source: null, retry: null, snapshot: null, at: 0, timelineBusy: false };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function ms(value) {
  if (value === null || value === undefined) return "–";
  if (value >= 60000) return (value / 60000).toFixed(1) + " min";
  if (value >= 1000) return (value / 1000).toFixed(1) + " s";
  return Math.max(0, Math.round(value)) + " ms";
}

// -- layout -------------------------------------------------------------------------------------

const status = el("span", { id: "status", class: "status off" }, "connecting…");
const cluster = el("span", { id: "cluster", class: "muted" });
const logout = el("button", { id: "logout", type: "button", hidden: "" }, "log out");
const header = el("header", {}, el("a", { href: "/ui/", class: "brand" }, "stockade"), cluster, status, logout);
const main = el("main", {});
document.body.append(header, main);

const login = el("form", { id: "login", class: "card", hidden: "" },
  el("h2", {}, "Log in"),
  el("p", { class: "muted" }, "This server checks bearer tokens. Paste one from its tokens file: it is exchanged once " +
    "for a session cookie and not kept by this page."),
  el("input", { id: "token", type: "password", autocomplete: "off", placeholder: "token", required: "" }),
  el("button", { type: "submit" }, "log in"),
  el("p", { id: "login-error", class: "error" }));
main.append(login);

const filter = el("input", { id: "filter", type: "search", placeholder: "filter scopes", value: state.q,
  "aria-label": "filter scopes" });
const pager = el("span", { id: "pager" });
const table = el("table", { id: "scopes" });
const rejections = el("section", { id: "rejections", class: "card" });
const health = el("section", { id: "health", class: "card" });
const timeline = el("section", { id: "timeline", class: "card" });
const board = el("div", { id: "board", class: scopePage ? "scope" : "", hidden: "" });
if (scopePage) {
  board.append(el("p", {}, el("a", { href: "/ui/" }, "← all scopes")), el("h1", {}, scopePage), table,
    el("h2", {}, "Timeline"), timeline);
} else {
  board.append(el("div", { class: "tools" }, filter, pager), table,
    el("div", { class: "side" }, rejections, health));
}
main.append(board);

// -- drawing ------------------------------------------------------------------------------------

function drawScopes(doc) {
  const rows = scopePage ? doc.scopes.filter((s) => s.scope === scopePage) : doc.scopes;
  const numeric = new Set(["token", "time left", "lock-delay", "high-water mark"]); // right-aligned, as their values
  const head = el("tr", {}, ...["scope", "state", "holder", "token", "time left", "waiters (in order)",
    "lock-delay", "high-water mark"].map((t) => el("th", { class: numeric.has(t) ? "num" : null }, t)));
  const body = rows.map((s) => el("tr", { class: s.state, "data-scope": s.scope },
    el("td", {}, el("a", { href: "/ui/scope/" + encodeURIComponent(s.scope) }, s.scope)),
    el("td", {}, el("span", { class: "badge " + s.state }, s.state)),
    el("td", {}, s.holder || "–"),
    el("td", { class: "num" }, s.token === null ? "–" : s.token),
    el("td", { class: "num left", "data-ms": s.remaining_ms === null ? "" : s.remaining_ms }, ms(s.remaining_ms)),
    el("td", {}, s.queue ? (s.queue.length ? s.queue.join(" → ") : "–") : String(s.waiters)),
    el("td", { class: "num delay", "data-ms": s.delay_ms || "" }, s.delay_ms ? ms(s.delay_ms) : "–"),
    el("td", { class: "num" }, s.high_water)));
  table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
  if (!rows.length) table.append(el("caption", {}, scopePage ? "no lease recorded for this scope" : "no scopes"));
  const first = doc.page * doc.page_scopes;
  pager.replaceChildren(
    el("button", { type: "button", id: "prev", disabled: doc.page === 0 ? "" : null }, "‹"),
    ` ${doc.scopes_seen ? first + 1 : 0}–${first + doc.scopes.length} of ${doc.scopes_seen}` +
      `${doc.exact ? "" : "+"} scopes, busiest first `,
    el("button", { type: "button", id: "next", disabled: doc.page + 1 >= doc.pages ? "" : null }, "›"));
}

function drawSide(doc) {
  if (!doc.limited && !doc.health) { // stockade ui: another process's health and counts are not known here
    rejections.replaceChildren(el("p", { class: "muted" }, "The server's health and rejection counts are on " +
      "its own dashboard (stockade serve's /ui/)."));
    health.hidden = true;
    return;
  }
  if (doc.limited) {
    rejections.replaceChildren(el("p", { class: "muted" }, "This session sees only its scopes: the server's " +
      "health and rejection counts are for tokens without scope limits."));
    health.hidden = true;
    return;
  }
  rejections.replaceChildren(el("h2", {}, "Fence rejections"), el("dl", {},
    ...Object.entries(doc.rejections).flatMap(([reason, n]) => [el("dt", {}, reason),
      el("dd", { class: n ? "num hot" : "num", "data-reason": reason }, n)])));
  const h = doc.health;
  // Mean and the 99th percentile's bucket bound, over the last 10 s of commits.
  const commit = (c) => c.commits ? `${c.mean_ms.toFixed(1)} / ≤ ${c.p99_ms === null ? "?" : c.p99_ms} ms` : "idle";
  health.replaceChildren(el("h2", {}, "Server"), el("dl", {},
    el("dt", {}, "connections"), el("dd", { class: "num" }, h.connections),
    el("dt", {}, "leases"), el("dd", { class: "num" }, h.leases),
    el("dt", {}, "waiters"), el("dd", { class: "num" }, h.waiters),
    el("dt", {}, "live views"), el("dd", { class: "num" }, `${h.streams} of ${h.streams_max}`),
    el("dt", {}, "lock-delay"), el("dd", { class: "num" }, ms(doc.lock_delay_ms)),
    el("dt", { title: "mean / 99th percentile, last 10 s" }, "coordinator commit"),
    el("dd", { class: "num" }, commit(h.commit.coordinator)),
    el("dt", { title: "mean / 99th percentile, last 10 s" }, "store commit"),
    el("dd", { class: "num" }, commit(h.commit.store))));
}

async function drawTimeline() {
  if (!scopePage || state.timelineBusy) return;
  state.timelineBusy = true;
  try {
    const answer = await fetch("/ui/api/timeline/" + encodeURIComponent(scopePage), { credentials: "same-origin" });
    if (answer.ok) timeline.innerHTML = await answer.text(); // escaped by the server (stockade/timeline.py)
  } finally {
    state.timelineBusy = false;
  }
}

function draw(doc) {
  state.snapshot = doc;
  state.at = performance.now();
  cluster.textContent = "cluster " + doc.cluster;
  board.hidden = false;
  login.hidden = true;
  drawScopes(doc);
  if (!scopePage) drawSide(doc);
  drawTimeline();
}

// Time left counts down between snapshots (the server sends one at least every 5 s).
setInterval(() => {
  const elapsed = performance.now() - state.at;
  for (const cell of document.querySelectorAll("td[data-ms]")) {
    if (cell.dataset.ms !== "") cell.textContent = ms(Math.max(0, Number(cell.dataset.ms) - elapsed));
  }
}, 250);

// -- the stream ---------------------------------------------------------------------------------

function setStatus(text, live) {
  status.textContent = text;
  status.className = "status " + (live ? "on" : "off");
}

function query() { // a scope's page asks for that scope by its whole name (a filter would match others too)
  return scopePage ? "scope=" + encodeURIComponent(scopePage) : `q=${encodeURIComponent(state.q)}&page=${state.page}`;
}

async function connect() {
  clearTimeout(state.retry);
  if (state.source) state.source.close();
  // Plain requests first: they tell a missing session from a server that is away.
  let session, answer;
  try {
    session = await (await fetch("/ui/api/session", { credentials: "same-origin" })).json();
    if (!session.logged_in) {
      board.hidden = true;
      login.hidden = false;
      logout.hidden = true;
      return setStatus("logged out", false);
    }
    logout.hidden = !session.auth;
    answer = await fetch("/ui/api/state?" + query(), { credentials: "same-origin" });
  } catch (error) {
    return later("server unreachable, retrying…");
  }
  if (!answer.ok) return later(`server answered ${answer.status}, retrying…`);
  draw(await answer.json());
  const source = new EventSource("/ui/events?" + query());
  state.source = source;
  source.addEventListener("open", () => setStatus("live", true));
  source.addEventListener("snapshot", (event) => { setStatus("live", true); draw(JSON.parse(event.data)); });
  source.addEventListener("busy", () => { source.close(); later("too many live views, retrying…"); });
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) later("stream closed, reconnecting…");
    else setStatus("reconnecting…", false);
  });
}

function later(text) {
  setStatus(text, false);
  if (state.source) state.source.close();
  state.source = null;
  clearTimeout(state.retry);
  state.retry = setTimeout(connect, 1000);
}

let typing = null;
filter.addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(() => { state.q = filter.value; state.page = 0; connect(); }, 200);
});
pager.addEventListener("click", (event) => {
  if (event.target.id === "prev" && state.page > 0) state.page -= 1;
  else if (event.target.id === "next") state.page += 1;
  else return;
  connect();
});
login.addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  const answer = await fetch("/ui/session", { method: "POST", credentials: "same-origin",
    headers: { Authorization: "Bearer " + input.value.trim() } });
  input.value = "";
  if (answer.status === 204) {
    document.getElementById("login-error").textContent = "";
    connect();
  } else {
    document.getElementById("login-error").textContent = "That token was refused.";
  }
});
logout.addEventListener("click", async () => {
  await fetch("/ui/session", { method: "DELETE", credentials: "same-origin" });
  connect();
});

connect();
