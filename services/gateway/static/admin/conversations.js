// Conversations: the site's list (the view's filters), a conversation's timeline, its state
// at an event, and rerun, diff, fork and verify by the replay worker.
import { $, api, el, linkTo, show, status } from "./core.js";
import { caseForm } from "./tests.js";

let current = null;   // {site, session}
let selectedSeq = null;

async function loadList() {
  const site = $("site").value.trim();
  const query = new URLSearchParams();
  if ($("route").value) query.set("route", $("route").value);
  if ($("intent").value.trim()) query.set("intent", $("intent").value.trim().toUpperCase());
  for (const name of ["failed", "blocked", "lead"]) if ($(name).checked) query.set(name, "true");
  status("loading…");
  try {
    const body = await api(site, `conversations?${query}`);
    const list = $("list"); list.replaceChildren();
    for (const row of body.conversations) {
      const item = el("div", null, "row"); item.dataset.session = row.session_id;
      item.append(el("div", row.last_message || "(no message)"));
      const meta = el("div", null, "muted");
      meta.append(el("span", `${new Date(row.last * 1000).toLocaleString()} · ${row.turns} turns `));
      for (const route of row.routes) meta.append(el("span", route, "tag"));
      if (row.failed_turns.length) meta.append(el("span", "failed", "tag bad"));
      if (row.blocked_turns.length) meta.append(el("span", "blocked", "tag bad"));
      if (row.lead_captured) meta.append(el("span", "lead", "tag good"));
      item.append(meta);
      item.addEventListener("click", () => openConversation(site, row.session_id, item));
      list.append(item);
    }
    status(`${body.conversations.length} of ${body.total} conversations`);
  } catch (error) { status(error.message, true); }
}

function summarize(event) {
  const e = event.event;
  const bits = { turn_requested: e.message, route_decided: `${e.route} ${e.branch || ""} (${e.intent})`,
    intent_classified: `${e.intent} ${e.confidence}`, skills_applied: (e.skills || []).join(", "),
    response_completed: e.text, suggestions_generated: (e.suggestions || []).join(" | "),
    retrieval_completed: `${(e.documents || []).length} documents`, turn_failed: `${e.node}: ${e.reason}` };
  const text = bits[event.type];
  return text === undefined ? "" : String(text).slice(0, 140);
}

async function openConversation(site, session, item) {
  for (const row of document.querySelectorAll("#list .row.selected")) row.classList.remove("selected");
  if (item) item.classList.add("selected");
  current = { site, session }; selectedSeq = null;
  linkTo("conversations", session);
  $("which").textContent = session; $("actions").hidden = false;
  const timeline = $("timeline"); timeline.replaceChildren(el("div", "loading…", "muted"));
  try {
    const body = await api(site, `conversations/${encodeURIComponent(session)}/events`);
    timeline.replaceChildren();
    const routed = {};  // turn → what the router decided: a new test case's first guess
    for (const event of body.events) if (event.type === "route_decided") routed[event.event.turn] = event.event;
    for (const event of body.events) {
      const box = el("details", null, "event"); box.dataset.seq = event.seq;
      const head = el("summary");
      head.append(el("span", `${event.seq} · turn ${event.event.turn} · `, "muted"), el("b", event.type),
                  el("span", ` ${event.event.producer} `, "muted"), el("span", summarize(event)));
      box.append(head, el("pre", JSON.stringify(event.event, null, 2)));
      const at = el("button", "state here"); at.addEventListener("click", () => stateAt(event.seq));
      box.append(at);
      let label = null;  // a visitor's turn: saved as a test case from here (tests.js)
      if (event.type === "turn_requested") {
        const turn = event.event.turn, decided = routed[turn] || {};
        const save = label = el("button", `Save turn ${turn} as a test case`, "save-case"); save.type = "button";
        save.addEventListener("click", () => {
          $("rightTitle").textContent = "New test case";
          caseForm($("right"), session, turn, event.event.message, { intent: decided.intent, route: decided.route });
        });
      }
      box.addEventListener("toggle", () => { if (box.open) selectedSeq = event.seq; });
      timeline.append(box);
      if (label) timeline.append(label);
    }
  } catch (error) { timeline.replaceChildren(el("div", error.message, "error")); }
}

async function stateAt(seq) {
  selectedSeq = seq;
  $("rightTitle").textContent = `State after event ${seq}`;
  try {
    const state = await api(current.site, `conversations/${encodeURIComponent(current.session)}/state?at=${seq}`);
    $("right").replaceChildren(el("pre", JSON.stringify(state, null, 2)));
  } catch (error) { $("right").replaceChildren(el("div", error.message, "error")); }
}

function showOutcome(title, outcome, cls) {
  const box = el("div"); box.append(el("h2", title));
  if (!outcome) { box.append(el("div", "(none)", "muted")); return box; }
  box.append(el("div", `${outcome.route || ""} · intent ${outcome.intent || ""} · skills ${(outcome.skills || []).join(", ")}`, "muted"));
  box.append(el("pre", outcome.answer || "", cls));
  if (outcome.suggestions) box.append(el("div", "suggestions: " + outcome.suggestions.join(" | "), "muted"));
  return box;
}

async function rerunDiff() {
  $("rightTitle").textContent = "Rerun with the current code (recorded LLM calls)";
  $("right").replaceChildren(el("div", "running…", "muted"));
  try {
    const body = await api(current.site, `conversations/${encodeURIComponent(current.session)}/diff`, { method: "POST", body: JSON.stringify({ current_config: $("currentConfig").checked }) });
    const out = [el("div", body.diverged ? "diverged" : "no differences: the current code decides as the original did", body.diverged ? "error" : "muted")];
    for (const d of body.differences) {
      out.push(el("h2", `turn ${d.turn} · ${d.field}`));
      out.push(el("pre", JSON.stringify(d.original), "diff-old"), el("pre", JSON.stringify(d.rerun), "diff-new"));
    }
    for (const d of body.divergences) out.push(el("div", `turn ${d.turn} ${d.node}: ${d.divergence}`, "error"));
    for (const s of body.skipped || []) out.push(el("div", `turn ${s.turn}: not re-runnable: ${s.reason}`, "muted"));
    for (const c of body.version_changes || []) out.push(el("div", `note: rerun under another ${c.what}: ${c.rerun.join(", ")} (recorded: ${c.recorded.join(", ")}; ${c.nodes.join(", ")})`, "muted"));
    $("right").replaceChildren(...out);
  } catch (error) { $("right").replaceChildren(el("div", error.message, "error")); }
}

async function fork() {
  if (selectedSeq === null) { status("open an event of the timeline: the fork keeps everything up to it", true); return; }
  const payload = { at: selectedSeq, message: $("forkMessage").value };
  if ($("forkInstructions").value.trim()) payload.instructions = $("forkInstructions").value;
  $("rightTitle").textContent = `Fork after event ${selectedSeq}`;
  $("right").replaceChildren(el("div", "running…", "muted"));
  try {
    const body = await api(current.site, `conversations/${encodeURIComponent(current.session)}/fork`, { method: "POST", body: JSON.stringify(payload) });
    const out = [showOutcome(`original turn ${body.turn}`, body.original, "diff-old"), showOutcome(`fork, turn ${body.turn}`, body.fork, "diff-new")];
    for (const d of body.divergences) out.push(el("div", `turn ${d.turn} ${d.node}: ${d.divergence}`, "error"));
    $("right").replaceChildren(...out);
  } catch (error) { $("right").replaceChildren(el("div", error.message, "error")); }
}

async function verify() {
  const site = $("site").value.trim();
  $("rightTitle").textContent = `Verify ${site}`;
  $("right").replaceChildren(el("div", "rerunning the site's conversations…", "muted"));
  try {
    const body = await api(site, "verify", { method: "POST", body: JSON.stringify({ current_config: $("currentConfig").checked }) });
    const out = [el("div", `${body.conversations} conversations, ${body.turns} turns: ${body.diverged} diverged, ${body.skipped} turns not re-runnable (${body.conversations_per_s} conversations/s)`, body.diverged ? "error" : "muted")];
    for (const d of body.divergences) out.push(el("pre", JSON.stringify(d)));
    for (const s of body.not_rerunnable || []) out.push(el("div", `${s.session_id} turn ${s.turn}: not re-runnable: ${s.reason}`, "muted"));
    for (const c of body.version_changes || []) out.push(el("div", `note: ${c.conversations} conversations rerun under another ${c.what}: ${c.rerun.join(", ")} (recorded: ${c.recorded.join(", ")})`, "muted"));
    $("right").replaceChildren(...out);
  } catch (error) { $("right").replaceChildren(el("div", error.message, "error")); }
}


$("load").addEventListener("click", () => { show("conversations"); loadList(); });
$("filter").addEventListener("click", () => { show("conversations"); loadList(); });
$("verify").addEventListener("click", () => { show("conversations"); verify(); });
$("diff").addEventListener("click", rerunDiff);
$("fork").addEventListener("click", fork);
// A deep link to a conversation (core.js's `route`).
window.addEventListener("concierge:open-conversation", (e) => openConversation(e.detail.site, e.detail.id, null));

const currentConversation = () => current;
export { currentConversation, loadList, openConversation };
