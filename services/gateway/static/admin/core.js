// The console's shared layer: the page's helpers, the session (sign-in, sign-out), the
// sidebar's navigation and deep links, the Inbox badge, the operator API client and the
// rendering helpers the views share. Each view is a module of its own (main.js loads them).

const $ = (id) => document.getElementById(id);
$("site").value = sessionStorage.getItem("concierge-admin-site") || "";

// The console's session (services/gateway/console_sessions.py): signed in once with a key, an
// HttpOnly cookie goes with every same-origin request after; the header says the request is
// the console's own (no other site's page can send it). No key is kept in the page.
const CONSOLE_HEADER = { "X-Concierge-Console": "1" };
async function adminFetch(url, options = {}) {
  const response = await fetch(url, { ...options, headers: { ...(options.headers || {}), ...CONSOLE_HEADER } });
  if (response.status === 401) showSignIn("Your session has ended: sign in again.");
  return response;
}
function showSignIn(message) {
  $("signIn").hidden = false;
  $("signInError").textContent = message || "";
  $("signInKey").focus();
}
function signedIn(who) {
  $("signIn").hidden = true;
  $("signInKey").value = "";
  $("who").textContent = who.kind === "admin" ? "Administrator: every site" : `${who.name} (${who.site})`;
  $("signOut").hidden = false;
  const choices = $("siteChoices");
  choices.replaceChildren(...(who.sites || [who.site]).map((name) => { const o = document.createElement("option"); o.value = name; return o; }));
  if (who.site) { $("site").value = who.site; $("site").readOnly = true; }
  else $("site").readOnly = false;
  $("addSite").hidden = who.kind !== "admin";  // making a site takes the ADMIN_TOKEN
  // Every view's script has run by then (the page parsed): a deep link can open any of them.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", route, { once: true });
  else route();
  countWaiting();
}
$("signInForm").addEventListener("submit", async (e) => {
  e.preventDefault();
  const response = await fetch("/v1/admin/session", { method: "POST", headers: { "Content-Type": "application/json" },
                                                       body: JSON.stringify({ key: $("signInKey").value }) });
  const body = await response.json().catch(() => ({}));
  if (response.ok) signedIn(body);
  else $("signInError").textContent = response.status === 401 ? "That key is not one of this deployment's."
    : typeof body.detail === "string" ? body.detail : `Sign-in failed (HTTP ${response.status})`;
});
$("signOut").addEventListener("click", async () => {
  await fetch("/v1/admin/session", { method: "DELETE" });
  $("who").textContent = ""; $("signOut").hidden = true; $("site").readOnly = false; $("addSite").hidden = true;
  showSignIn("Signed out.");
});
(async () => {
  const response = await fetch("/v1/admin/session", { headers: CONSOLE_HEADER });
  if (response.ok) signedIn(await response.json());
  else showSignIn();
})();

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}
function status(text, bad) { $("status").textContent = text; $("status").className = bad ? "error" : "muted"; }

// A refused request's field errors ({field, message}: `errors`, or `detail` as every 422 has
// them), a line saying what went wrong, and each error shown beside its field
// (`.field[data-field]` in `form`), the rest in `general` (the Knowledge, Insight and Inbox views).
const fieldErrors = (answer) => answer.body.errors || (Array.isArray(answer.body.detail) ? answer.body.detail : []);
const problem = (answer) => typeof answer.body.detail === "string" ? answer.body.detail
  : fieldErrors(answer).map((d) => (d.field ? d.field + ": " : "") + d.message).join("; ") || `HTTP ${answer.status}`;
function showFieldErrors(form, errors, general) {
  for (const box of form.querySelectorAll(".field")) {
    box.classList.remove("invalid");
    box.querySelector(".field-error").textContent = "";
    for (const input of box.querySelectorAll("input, select, textarea")) input.removeAttribute("aria-invalid");
  }
  const rest = [];
  for (const error of errors) {
    const box = error.field && form.querySelector(`.field[data-field="${CSS.escape(error.field)}"]`);
    if (!box || box.hidden) { rest.push((error.field ? error.field + ": " : "") + error.message); continue; }
    box.classList.add("invalid");
    for (const input of box.querySelectorAll("input, select, textarea")) input.setAttribute("aria-invalid", "true");
    const text = box.querySelector(".field-error");
    text.textContent = (text.textContent ? text.textContent + "; " : "") + error.message;
  }
  general.textContent = rest.join("; ");
}

// A view of its own (Site, Knowledge, Insight, Inbox, Accounts), opened by its button in the
// sidebar (or one added there): every other sidebar button hides it; `open` loads what it shows.
function headerView(viewId, buttonId, label, open) {
  const view = $(viewId);
  let button = $(buttonId);
  if (!button) {
    button = document.createElement("button");
    button.id = buttonId; button.type = "button"; button.textContent = label;
    $("sidebar").append(button);
  }
  $("sidebar").addEventListener("click", (e) => {
    const clicked = e.target.closest("button");
    if (clicked && clicked !== button) view.hidden = true;
  });
  button.addEventListener("click", () => {
    for (const main of document.querySelectorAll("main")) main.hidden = main !== view;
    open();
  });
  return view;
}

// One navigation: the sidebar's current view marked, and deep links that survive a reload:
// #/sites/<site>/<view>[/<conversation>] (`route` opens what one names once signed in).
const VIEW_BUTTONS = { inbox: "inbox", conversations: "load", insight: "insight", knowledge: "knowledge",
                       accounts: "accounts", leads: "leads", tests: "tests", settings: "siteSettings", new: "addSite" };
const LINK_RE = /^#\/sites\/([A-Za-z0-9_-]{1,64})\/([a-z]+)(?:\/([A-Za-z0-9_-]{1,64}))?$/;
function linkTo(view, id) {
  const site = $("site").value.trim();
  if (!site) return;
  const hash = `#/sites/${encodeURIComponent(site)}/${view}` + (id ? `/${encodeURIComponent(id)}` : "");
  if (location.hash !== hash) history.replaceState(null, "", hash);
}
let routing = false;  // a deep link being opened: its address is already the one to show
$("sidebar").addEventListener("click", (e) => {
  const clicked = e.target.closest("button[data-view]");
  if (!clicked) return;
  for (const b of $("sidebar").querySelectorAll("button")) b.removeAttribute("aria-current");
  clicked.setAttribute("aria-current", "page");
  if (!routing) linkTo(clicked.dataset.view);
  countWaiting();
});
function route() {
  const found = LINK_RE.exec(location.hash);
  if (!found) return false;
  const [, site, view, id] = found;
  if (!$("site").readOnly) $("site").value = site;
  const button = $(VIEW_BUTTONS[view] || "");
  if (!button) return false;
  // The view's button opens it without rewriting the address to the view's own: never the
  // link without its conversation, not even for a moment (a reload then would lose it).
  routing = true;
  try { button.click(); } finally { routing = false; }
  linkTo(view, id);  // the site shown (a site's own key signs in to its site only)
  if (view === "conversations" && id) {  // conversations.js opens it
    window.dispatchEvent(new CustomEvent("concierge:open-conversation", { detail: { site: $("site").value.trim(), id } }));
  }
  return true;
}
window.addEventListener("hashchange", route);

// The Inbox's badge: conversations waiting for an operator on the site, asked every 20 s.
async function countWaiting() {
  const site = $("site").value.trim();
  if (!site || !$("signIn").hidden) return;
  try {
    const response = await adminFetch(`/v1/admin/sites/${encodeURIComponent(site)}/handoffs`);
    if (!response.ok) { $("inboxBadge").hidden = true; return; }
    const waiting = ((await response.json()).handoffs || []).filter((h) => h.status === "waiting").length;
    $("inboxBadge").textContent = String(waiting);
    $("inboxBadge").hidden = waiting === 0;
    $("inbox").setAttribute("aria-label", waiting ? `Inbox, ${waiting} waiting` : "Inbox");
  } catch (error) { /* asked again at the next tick */ }
}
setInterval(countWaiting, 20000);
$("site").addEventListener("change", countWaiting);

// The operator API: everything under /v1/admin/sites/{site}/ (services/gateway/routes/operator.py).
async function api(site, path, options = {}) {
  sessionStorage.setItem("concierge-admin-site", $("site").value);
  const response = await adminFetch(`/v1/admin/sites/${encodeURIComponent(site)}/${path}`, { ...options, headers: { "Content-Type": "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error((body.error || response.status) + ": " + (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || "")));
    error.status = response.status;
    throw error;
  }
  return body;
}


// A view's call of the operator API that says its own errors: {status, ok, body, at} (an HTTP
// error is an answer, not a throw; `at`: the server's clock). `path` is under the site ("" the
// site itself; "keys" and "/keys" alike); `body`: an object sent as JSON, or a string or a file
// sent as it is, as `type`; `on`: another site than the one chosen (an administrator's).
async function siteCall(method, path = "", body, { type = "application/json", on } = {}) {
  const chosen = $("site").value.trim();
  sessionStorage.setItem("concierge-admin-site", chosen);
  const under = path && !path.startsWith("/") ? `/${path}` : path;
  const raw = body === undefined || typeof body === "string" || body instanceof Blob;
  const response = await adminFetch(`/v1/admin/sites/${encodeURIComponent(on || chosen)}${under}`, {
    method, body: raw ? body : JSON.stringify(body), headers: { "Content-Type": type } });
  const date = Date.parse(response.headers.get("Date") || "");
  return { status: response.status, ok: response.ok, body: await response.json().catch(() => ({})),
           at: (Number.isNaN(date) ? Date.now() : date) / 1000 };
}


// --- what the views share: which main view shows, waiting on a work queue, markdown, times ---

function show(view) {
  $("conversationsView").hidden = view !== "conversations";
  $("leadsView").hidden = view !== "leads";
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// The enricher writes briefs and triages off a work queue: ask again until `check` has it.
async function until(check, what, seconds = 180) {
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) {
    const found = await check();
    if (found) return found;
    await sleep(1000);
  }
  throw new Error(`no ${what} after ${seconds} s: is the enricher running?`);
}

// A brief's or a report's markdown, a safe subset built with DOM calls only (never innerHTML:
// the text is a model's, and the model read the visitor's): headings, paragraphs, bullet and
// numbered lists, quotes, pipe tables (a report's Key Metrics), **bold**. Anything else, HTML
// included, stays text.
const BOLD = /\*\*(.+?)\*\*|__(.+?)__/g;
function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(BOLD)) {
    parent.append(text.slice(last, m.index), el("strong", m[1] ?? m[2]));
    last = m.index + m[0].length;
  }
  parent.append(text.slice(last));
}
function markdown(text) {
  const box = el("div", null, "md");
  let para = [], list = null, table = null;
  const block = (tag, line) => { const node = el(tag); inline(node, line); return node; };
  const endParagraph = () => { if (para.length) box.append(block("p", para.join(" "))); para = []; };
  for (const line of String(text || "").replace(/\r\n?/g, "\n").split("\n")) {
    const row = /^\s*\|(.*)\|\s*$/.exec(line);
    if (row) {
      endParagraph(); list = null;
      const cells = row[1].split("|").map((cell) => cell.trim());
      if (table && table.rows.length === 1 && cells.every((cell) => /^:?-+:?$/.test(cell))) {
        for (const cell of [...table.rows[0].cells]) { const head = el("th"); head.append(...cell.childNodes); cell.replaceWith(head); }
        continue;  // the line under the header row
      }
      if (!table) { table = el("table"); box.append(table); }
      const tr = el("tr");
      for (const cell of cells) tr.append(block("td", cell));
      table.append(tr);
      continue;
    }
    table = null;
    const heading = /^(#{1,6})\s+(.*)$/.exec(line), quote = /^>\s?(.*)$/.exec(line);
    const bullet = /^\s*[-*\u2022]\s+(.*)$/.exec(line), numbered = /^\s*\d+[.)]\s+(.*)$/.exec(line);
    if (bullet || numbered) {
      endParagraph();
      const tag = bullet ? "UL" : "OL";
      if (!list || list.tagName !== tag) { list = el(tag.toLowerCase()); box.append(list); }
      list.append(block("li", (bullet || numbered)[1]));
      continue;
    }
    list = null;
    if (heading) { endParagraph(); box.append(block(heading[1].length <= 2 ? "h3" : "h4", heading[2])); }
    else if (quote) { endParagraph(); box.append(block("blockquote", quote[1])); }
    else if (!line.trim()) endParagraph();
    else para.push(line.trim());
  }
  endParagraph();
  return box;
}

const when = (ts) => ts ? new Date(ts * 1000).toLocaleString() : "";


export { $, el, status, fieldErrors, problem, showFieldErrors, headerView, adminFetch, api, siteCall, linkTo, show, sleep,
         until, markdown, when };
