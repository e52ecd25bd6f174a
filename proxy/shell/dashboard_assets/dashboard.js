// The dashboard of acp-fault-proxy: plain JavaScript, no build step, nothing fetched from elsewhere.
//
// It reads the control API of the proxy that served it: the trace records live from
// /api/events?bodies=1 (the lanes, the summary, the findings), the rules and their counters from
// /api/rules, the links from /api/links, the held messages from /api/held. Every record is kept in
// a bounded buffer (KEPT) and at most WINDOW rows are on the page; the page says how many it left
// out. Records are drawn once per animation frame, so a burst of thousands costs one layout.
"use strict";

const KEPT = 5000; // records kept for re-filtering
const WINDOW = 400; // rows on the page at most
const POLL_MS = 1000; // rules, links and held messages are read again this often
const CSRF = document.querySelector('meta[name="acp-csrf"]').content;

const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// -- the control API ------------------------------------------------------------------------------

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  if (method !== "GET" && CSRF) init.headers["X-CSRF-Token"] = CSRF;
  const response = await fetch(path, init);
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401) window.location.replace("/"); // the login ended
  if (!response.ok) {
    const error = new Error(answer.error || `${method} ${path}: ${response.status}`);
    error.status = response.status;
    error.errors = answer.errors || [];
    throw error;
  }
  return answer;
}

// -- the records, the filters and the lanes -------------------------------------------------------

const state = {
  records: [], // the last KEPT records, each {n, record}
  next: 1, // the number of the next record
  queue: [], // records arrived since the last frame
  shown: new Map(), // row number -> record, for the rows on the page
  keys: new Map(), // idempotency key -> row number of its first prompt
  keyed: new Map(), // link -> its last `keyed` record, named on the prompt after it
  times: [], // arrival times of the message records of the last second
  messages: 0,
  faults: 0,
  findings: 0,
  drawn: 0, // records that have a row (all but `keyed`: it names the prompt after it)
  drawPending: false,
};

function kindOf(record) {
  if (record.event === "message") return record.kind || "message";
  return record.event;
}

function matches(record) {
  const link = $("f-link").value;
  if (link && String(record.link) !== link) return false;
  const kind = $("f-kind").value;
  if (kind && kindOf(record) !== kind) return false;
  const method = $("f-method").value.trim();
  if (method && !glob(method).test(record.method || "")) return false;
  const session = $("f-session").value.trim();
  if (session && !(record.session || "").includes(session)) return false;
  return true;
}

const globs = new Map();
function glob(pattern) {
  if (!globs.has(pattern)) {
    if (globs.size > 100) globs.clear(); // one per pattern typed: kept few
    const escaped = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
    globs.set(pattern, new RegExp(`^${escaped}$`));
  }
  return globs.get(pattern);
}

// Where a record's arrow runs on the lanes (Client | proxy | Agent), and how it is labelled.
// The sign of a held message: a double bar, in the fonts every system has (a pause sign, U+23F8,
// drew as a box where no font has it).
const HELD_SIGN = "‖";

function shape(record) {
  const toAgent = record.direction === "to_agent";
  const from = toAgent ? "client" : "agent";
  const to = toAgent ? "agent" : "client";
  switch (record.event) {
    case "message": {
      const label = [record.method || record.kind, idText(record)].filter(Boolean).join(" ");
      if (record.disposition && record.disposition !== "relayed") {
        return { from, to: "proxy", label: `${label} ✕ ${record.disposition}${record.rule ? ` (${record.rule})` : ""}`, mark: "fault" };
      }
      if (record.hold !== undefined) return { from: "proxy", to, label: `${label} (released)`, mark: "released" };
      return { from, to, label, mark: record.kind };
    }
    case "held": {
      const name = record.held_id === undefined ? "held" : `held #${record.held_id}`;
      return { from, to: "proxy", label: `${record.method || record.kind} ${idText(record)} ${HELD_SIGN} ${name} ${Math.round(record.delay_ms)} ms (${(record.rules || []).join(", ")})`, mark: "held" };
    }
    case "held_ended":
      return { at: "proxy", label: `held #${record.held_id}: ${record.outcome}`, mark: "held" };
    case "fault":
      // A hold stops nothing (yet): its sign is the held one, not the cross of a stopped message.
      return { from, to: "proxy", label: `${record.action === "hold" ? HELD_SIGN : "✕"} ${record.rule}: ${record.action} ${record.method || record.kind || ""}`, mark: "fault" };
    case "connection":
      return { at: record.side === "client" ? "client" : "agent", label: `${record.side} ${record.state} (${record.transport})`, mark: "connection" };
    case "finding":
      return { at: "proxy", label: `finding ${record.check}: ${record.detail}`, mark: "finding" };
    case "keyed":
      return null; // named on the prompt it precedes
    case "keyed_message":
      return { at: "proxy", label: `key ${record.key}: message ${record.message_id} (${record.via})`, mark: "other" };
    default:
      return { at: "proxy", label: `${record.event} ${record.what || record.result || ""}`, mark: "other" };
  }
}

function idText(record) {
  if (record.id === null || record.id === undefined) return "";
  const forwarded = record.forwarded_id !== undefined && record.forwarded_id !== record.id ? `→${JSON.stringify(record.forwarded_id)}` : "";
  return `#${JSON.stringify(record.id)}${forwarded}`;
}

function row(n, record, view) {
  const node = element("div", `row ${view.mark || ""}`);
  node.dataset.n = n;
  node.append(element("span", "num", n), element("span", "link", record.link === null || record.link === undefined ? "" : `L${record.link}`));
  const lanes = element("span", "lanes");
  if (view.at) {
    lanes.append(element("span", `dot at-${view.at}`));
  } else {
    const arrow = element("span", `arrow from-${view.from} to-${view.to}`);
    lanes.append(arrow);
  }
  lanes.append(element("span", `label at-${view.at || view.from}`, view.label));
  node.append(lanes);
  if (view.key) {
    const key = element("span", "key", `key ${view.key}`);
    if (view.retryOf) {
      const to = element("a", "retry-of", ` retry of #${view.retryOf}`);
      to.href = `#row-${view.retryOf}`;
      key.append(to);
      node.classList.add("retry");
    }
    lanes.append(key);
  }
  node.id = `row-${n}`;
  return node;
}

// A relayed prompt carries the key its `keyed` record (just before it, on its link) named; a
// retry links to the row of the key's first prompt.
function nameKey(n, record, view) {
  if (record.event === "keyed") {
    state.keyed.set(record.link, record);
    return;
  }
  if (record.event !== "message" || record.method !== "session/prompt" || record.direction !== "to_agent") return;
  const keyed = state.keyed.get(record.link);
  if (!keyed || !view) return;
  state.keyed.delete(record.link);
  view.key = keyed.key;
  if (keyed.retry && state.keys.has(keyed.key)) view.retryOf = state.keys.get(keyed.key);
  else if (!state.keys.has(keyed.key)) state.keys.set(keyed.key, n);
}

function receive(record) {
  const n = state.next++;
  state.records.push({ n, record });
  if (state.records.length > KEPT + KEPT / 4) state.records.splice(0, state.records.length - KEPT);
  if (record.event !== "keyed") state.drawn++;
  state.queue.push({ n, record }); // a hidden tab draws no frame: bounded too
  if (state.queue.length > WINDOW * 2) state.queue.splice(0, state.queue.length - WINDOW);
  count(record);
  if (!state.drawPending) {
    state.drawPending = true;
    requestAnimationFrame(draw);
  }
}

function count(record) {
  if (record.event === "message") {
    state.messages++;
    state.times.push(performance.now());
  } else if (record.event === "fault") {
    state.faults++;
  } else if (record.event === "finding") {
    state.findings++;
    addFinding(record);
  } else if (record.event === "connection" && record.link !== null && record.link !== undefined) {
    addLinkOption(record.link);
  }
  if (record.event === "held_ended") editLost(record);
  if (record.event === "held" || record.event === "held_ended") pollHeld();
}

// A message that ends while its card is being edited (its timeout, its link's end, someone
// else's act) takes the card with it: say so, and that the edit was not sent.
function editLost(record) {
  const card = [...$("held").children].find((each) => each.dataset.id === String(record.held_id));
  const body = card && card.querySelector("textarea.held-body");
  if (!body || body.readOnly || record.outcome === "edit") return;
  const said = $("held-error");
  said.textContent = `held #${record.held_id} ended (${record.outcome}) while it was edited: the edit was not sent`;
  said.hidden = false;
}

function draw() {
  state.drawPending = false;
  const batch = state.queue.splice(0);
  const rows = $("rows");
  const fragment = document.createDocumentFragment();
  for (const { n, record } of batch) {
    const view = shape(record);
    nameKey(n, record, view);
    if (!view || !matches(record)) continue;
    state.shown.set(n, record);
    fragment.append(row(n, record, view));
  }
  rows.append(fragment);
  trim();
  summary();
  if ($("traffic").dataset.follow !== "no") rows.scrollTop = rows.scrollHeight;
}

function trim() {
  const rows = $("rows");
  while (rows.childElementCount > WINDOW) {
    const first = rows.firstElementChild;
    state.shown.delete(Number(first.dataset.n));
    first.remove();
  }
  const left = state.drawn - rows.childElementCount;
  const note = $("left-out");
  note.hidden = left <= 0;
  note.textContent = `${left.toLocaleString()} earlier or filtered-out records left out (the page keeps the last ${WINDOW} rows)`;
}

function redraw() {
  $("rows").replaceChildren();
  state.shown.clear();
  state.keys.clear();
  state.keyed.clear();
  state.queue = state.records.slice();
  draw();
}

function summary() {
  const now = performance.now();
  while (state.times.length && state.times[0] < now - 1000) state.times.shift();
  $("rate").textContent = state.times.length;
  $("messages").textContent = state.messages.toLocaleString();
  $("faults").textContent = state.faults.toLocaleString();
  $("findings-count").textContent = state.findings;
}

function showDetail(n) {
  const record = state.shown.get(n);
  if (!record) return;
  const { body, truncated, ...rest } = record;
  let text = JSON.stringify(rest, null, 2);
  if (body !== undefined) {
    let shown = body;
    try {
      shown = JSON.stringify(JSON.parse(body), null, 2);
    } catch {
      // cut short (truncated) or not JSON: shown as it came
    }
    text += `\n\nbody${truncated ? " (truncated)" : ""}:\n${shown}`;
  }
  $("detail").textContent = text;
  $("detail-hint").textContent = `record #${n}`;
  for (const old of document.querySelectorAll(".row.selected")) old.classList.remove("selected");
  const node = $(`row-${n}`);
  if (node) node.classList.add("selected");
}

function addLinkOption(link) {
  const select = $("f-link");
  if ([...select.options].some((option) => option.value === String(link))) return;
  select.append(new Option(`link ${link}`, String(link)));
}

function addFinding(record) {
  const item = element("li", "finding", `${record.check}: ${record.detail || ""}`);
  if (record.session) item.append(element("span", "note", ` session ${record.session}`));
  if (record.key) item.append(element("span", "note", ` key ${record.key}`));
  $("findings").append(item);
  while ($("findings").childElementCount > WINDOW) $("findings").firstElementChild.remove();
}

// -- the live stream ------------------------------------------------------------------------------

// The proxy drops a subscriber that lets 1,024 records wait unread (a burst faster than the page
// reads, a hidden tab); the browser reconnects, and the page says records went missing.
function listen() {
  const source = new EventSource("/api/events?bodies=1");
  const live = $("live");
  let opened = false;
  let cuts = 0;
  source.onopen = () => {
    live.textContent = "live";
    live.className = "live on";
    if (opened) {
      cuts++;
      $("gaps").hidden = false;
      $("gaps").textContent = `The live stream was cut ${cuts} time(s) (the page fell behind, or the proxy restarted): records are missing.`;
    }
    opened = true;
  };
  source.onerror = () => {
    live.textContent = "reconnecting";
    live.className = "live off";
  };
  source.onmessage = (event) => receive(JSON.parse(event.data));
}

// -- rules ----------------------------------------------------------------------------------------

async function pollRules() {
  const { rules, counters } = await api("GET", "/api/rules");
  const body = $("rules").tBodies[0];
  const rows = rules.map((rule) => {
    const counter = counters[rule.name] || { matched: 0, fired: 0 };
    const tr = element("tr", rule.enabled === false ? "disabled" : "");
    tr.dataset.rule = rule.name;
    tr.append(
      element("td", "name", rule.name),
      element("td", "", rule.do.action),
      element("td", "matched", counter.matched),
      element("td", "fired", counter.fired),
    );
    const actions = element("td", "actions");
    const toggle = element("button", "toggle", rule.enabled === false ? "enable" : "disable");
    toggle.type = "button";
    toggle.onclick = () => act(() => api("PATCH", `/api/rules/${encodeURIComponent(rule.name)}`, { enabled: rule.enabled === false }));
    const remove = element("button", "delete", "delete");
    remove.type = "button";
    remove.onclick = () => act(() => api("DELETE", `/api/rules/${encodeURIComponent(rule.name)}`));
    actions.append(toggle, remove);
    tr.append(actions);
    return tr;
  });
  body.replaceChildren(...rows);
}

async function act(call) {
  try {
    await call();
  } catch (error) {
    showErrors([error.message, ...error.errors]);
  }
  await pollRules().catch(() => {});
}

function showErrors(lines) {
  $("rule-errors").replaceChildren(...lines.map((line) => element("li", "error", line)));
}

$("add-rule").addEventListener("submit", async (event) => {
  event.preventDefault();
  showErrors([]);
  try {
    await api("POST", "/api/rules/text", { text: $("rule-text").value });
    showErrors([]);
    $("rule-errors").append(element("li", "ok", "added"));
  } catch (error) {
    showErrors(error.errors.length ? error.errors : [error.message]);
  }
  await pollRules();
});

// -- links ----------------------------------------------------------------------------------------

async function pollLinks() {
  const { links } = await api("GET", "/api/links");
  $("links").textContent = links.length;
  let pending = 0;
  for (const link of links) {
    addLinkOption(link.id);
    for (const count of Object.values(link.pending || {})) pending += count;
  }
  $("pending").textContent = pending;
}

// -- held messages (the `hold` action: GET /api/held, POST /api/held/{id}/release|drop|edit) --------

// The one place that reads a held message (GET /api/held, GET /api/held/{id}): names differ
// between versions of the API, so each field is read under every name it has had.
function heldView(raw) {
  const pick = (...names) => names.map((name) => raw[name]).find((value) => value !== undefined && value !== null);
  const body = pick("body", "message");
  return {
    id: pick("id", "held_id"),
    link: pick("link"),
    direction: pick("direction"),
    method: pick("method") ?? "(answer)",
    jsonrpcId: pick("jsonrpc_id", "message_id"),
    session: pick("session") ?? "",
    size: pick("size") ?? "",
    rule: pick("rule", "rules") ?? "",
    since: pick("held_since", "since", "time"),
    timeout: pick("timeout_ms", "timeout"),
    then: pick("then", "on_timeout") ?? "",
    body: body === undefined ? null : typeof body === "string" ? body : JSON.stringify(body, null, 2),
    truncated: Boolean(raw.truncated || (body && body.truncated)), // body null: GET /api/held/{id}
  };
}

let heldMissing = false;
// The list is read from several places at once (the poll, a `held` record, an act): the answers
// may come back out of order, and one older than the list on the page would bring back the card
// of a message released since.
let heldAsked = 0;
let heldShown = 0;

async function pollHeld() {
  if (heldMissing) return;
  const asked = ++heldAsked;
  let answer;
  try {
    answer = await api("GET", "/api/held");
  } catch (error) {
    if (error.status === 404) {
      heldMissing = true;
      $("held-note").textContent = "This proxy has no hold action (GET /api/held: 404).";
      return;
    }
    throw error;
  }
  if (asked < heldShown) return;
  heldShown = asked;
  const held = (Array.isArray(answer) ? answer : answer.held || []).map(heldView);
  $("held-note").textContent = held.length ? "" : "Nothing is held.";
  // A held message's card stays while it is held (a button under the pointer, an edit under way).
  const cards = new Map([...$("held").children].map((card) => [card.dataset.id, card]));
  $("held").replaceChildren(...held.map((view) => cards.get(String(view.id)) || heldCard(view)));
}

function heldCard(view) {
  const card = element("div", "held-card");
  card.dataset.id = view.id;
  const since = typeof view.since === "number" ? new Date(view.since * 1000).toLocaleTimeString() : view.since || "";
  card.append(
    element("div", "held-head", [
      `#${view.id}`,
      `link ${view.link}`,
      view.direction,
      view.method || "answer",
      view.jsonrpcId === undefined || view.jsonrpcId === null ? null : `id ${JSON.stringify(view.jsonrpcId)}`,
      view.session ? `session ${view.session}` : null,
      `${view.size} B`,
      `rule ${view.rule}`,
    ].filter(Boolean).join(" · ")),
    element("div", "note", `since ${since}; after ${view.timeout ?? "?"} ms: ${view.then}${view.truncated ? "; body truncated" : ""}`),
  );
  const body = element("textarea", "held-body");
  body.value = view.body ?? "(over 16 KiB: Edit loads it whole)";
  body.rows = 6;
  body.spellcheck = false;
  body.readOnly = true;
  const path = `/api/held/${encodeURIComponent(view.id)}`;
  const error = element("p", "error");
  const button = (text, onclick) => {
    const node = element("button", text.split(" ")[0].toLowerCase(), text);
    node.type = "button";
    node.onclick = onclick;
    return node;
  };
  const release = button("Release", () => settle(view.id, "release"));
  const drop = button("Drop", () => settle(view.id, "drop"));
  const edit = button("Edit", async () => {
    if (view.body === null) {
      try {
        body.value = heldView(await api("GET", path)).body ?? "";
      } catch (failure) {
        error.textContent = failure.message;
        return;
      }
    }
    body.readOnly = false;
    body.focus();
    edit.hidden = true;
    release.hidden = true; // Release would send the message as it came, the edit thrown away
    send.hidden = false;
  });
  const send = button("Release edited", async () => {
    let message;
    try {
      message = JSON.parse(body.value);
    } catch (failure) {
      error.textContent = `not JSON: ${failure.message}`;
      return;
    }
    await settle(view.id, "edit", { body: message }, error);
  });
  send.hidden = true;
  card.append(body, release, drop, edit, send, error);
  return card;
}

// Release, drop or edit a held message. An edit the API refuses (400: what is wrong with it) is
// said in its card, the message still held; any other refusal in the panel, since the card goes
// at the next read when the message is held no more (409: released or dropped elsewhere, timed
// out, its link ended).
async function settle(id, verb, body, cardError) {
  const said = $("held-error");
  try {
    await api("POST", `/api/held/${encodeURIComponent(id)}/${verb}`, body);
    said.hidden = true;
  } catch (failure) {
    if (cardError && failure.status === 400) {
      cardError.textContent = failure.message;
    } else {
      said.textContent = `${verb} #${id}: ${failure.message}`;
      said.hidden = false;
    }
  }
  await pollHeld().catch(() => {});
}

// -- start ----------------------------------------------------------------------------------------

function poll(read) {
  const again = () => read().catch(() => {}).finally(() => setTimeout(again, POLL_MS));
  again();
}

for (const id of ["f-link", "f-kind", "f-method", "f-session"]) $(id).addEventListener("input", redraw);
$("filters").addEventListener("submit", (event) => event.preventDefault());
$("rows").addEventListener("click", (event) => {
  const node = event.target.closest(".row");
  if (node && !event.target.closest("a")) showDetail(Number(node.dataset.n));
});
$("rows").addEventListener("scroll", () => {
  const rows = $("rows");
  $("traffic").dataset.follow = rows.scrollTop + rows.clientHeight >= rows.scrollHeight - 40 ? "yes" : "no";
});
if (CSRF) {
  $("logout").hidden = false;
  $("logout").onclick = async () => {
    await api("POST", "/api/logout").catch(() => {});
    window.location.replace("/");
  };
}
api("GET", "/api/findings").then(({ findings }) => {
  state.findings += findings.length;
  findings.forEach(addFinding);
}, () => {});
listen();
poll(pollRules);
poll(pollLinks);
poll(pollHeld);
setInterval(summary, 500);
