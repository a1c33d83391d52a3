// Leads: their briefs, call scripts and the site's triage (services/gateway/routes/briefs.py).
import { $, el, status, api, show, until, markdown, when } from "./core.js";

const STATUS = { completed: "tag good", failed: "tag bad", none: "tag" };
let leadEmails = {};  // session → e-mail, for the triage's lines

async function loadLeads() {
  show("leads");
  const site = $("site").value.trim();
  status("loading leads…");
  try {
    const rows = await showLeads(site);
    status(`${rows.length} leads`);
  } catch (error) { status(error.message, true); }
  try { showTriage(await api(site, "triage")); }
  catch (error) { $("triageBox").replaceChildren(el("div", error.status === 404 ? "no triage yet" : error.message, error.status === 404 ? "muted" : "error")); }
}

async function showLeads(site) {
  const body = await api(site, "briefs");
  const selected = document.querySelector("#leadRows .selected")?.dataset.session;
  const rows = $("leadRows"); rows.replaceChildren();
  leadEmails = {};
  for (const lead of body.leads) {
    leadEmails[lead.session_id] = lead.email;
    const tr = el("tr", null, "row"); tr.dataset.session = lead.session_id;
    if (lead.session_id === selected) tr.classList.add("selected");
    const verdict = el("td"); if (lead.verdict) verdict.append(el("span", lead.verdict, lead.verdict === "pass" ? "tag good" : "tag bad"));
    const state = el("td"); state.append(el("span", lead.status, STATUS[lead.status]));
    tr.append(el("td", lead.email), el("td", lead.priority ?? ""), el("td", (lead.stage || "").replaceAll("_", " ")),
              verdict, state, el("td", new Date(lead.captured * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" }), "muted"));
    tr.addEventListener("click", () => openLead(site, lead.session_id));
    rows.append(tr);
  }
  return body.leads;
}

async function openLead(site, session) {
  for (const row of document.querySelectorAll("#leadRows tr")) row.classList.toggle("selected", row.dataset.session === session);
  $("briefWhich").textContent = `${leadEmails[session] || ""} · ${session}`;
  $("brief").replaceChildren(el("div", "loading…", "muted")); $("callScript").replaceChildren();
  let body;
  try { body = await api(site, `briefs/${encodeURIComponent(session)}`); }
  catch (error) {
    $("brief").replaceChildren(el("div", error.status === 404 ? "no brief yet" : error.message, error.status === 404 ? "muted" : "error"));
    return;
  }
  const e = body.event;
  if (body.type === "brief_failed") {
    $("brief").replaceChildren(el("div", `the latest brief failed (${e.node}, ${e.attempts} attempts, ${when(e.ts)}): ${e.reason}`, "error"));
    return;
  }
  const m = e.metadata, meta = el("div", null, "muted");
  meta.append(el("span", `priority ${m.priority}`, "tag"), el("span", m.stage.replaceAll("_", " "), "tag"),
              el("span", `${m.estimated_seats} seats`, "tag"), el("span", `confidence ${m.confidence}`, "tag"),
              el("span", ` ${e.backend} · drafts ${e.attempts} · ${when(e.ts)}`));
  const checks = el("div");
  checks.append(e.verdict ? el("span", `verdict ${e.verdict}`, e.verdict === "pass" ? "tag good" : "tag bad")
                          : el("span", "not evaluated", "muted"));
  const out = [meta, checks];
  if (e.issues.length) {
    const issues = el("ul", null, "error");
    for (const issue of e.issues) issues.append(el("li", issue));
    out.push(issues);
  }
  if (e.ungrounded_numbers.length) {
    const numbers = el("div", "numbers found in no input: ", "error");
    for (const n of e.ungrounded_numbers) numbers.append(el("span", n, "tag bad"));
    out.push(numbers);
  }
  if (e.missing_sections.length) out.push(el("div", "missing sections: " + e.missing_sections.join(", "), "error"));
  $("brief").replaceChildren(...out, markdown(e.brief));
  $("callScript").replaceChildren(markdown(e.call_script));
}

async function rewriteBriefs() {
  const site = $("site").value.trim();
  status("queueing briefs…");
  try {
    const body = await api(site, "briefs", { method: "POST", body: "{}" });
    const waiting = new Set(body.queued.map((q) => q.request_id));
    await until(async () => {
      const written = (await showLeads(site)).filter((lead) => waiting.has(lead.request_id)).length;
      status(`${written} of ${waiting.size} briefs written`);
      return written === waiting.size;
    }, "briefs");
    const open = document.querySelector("#leadRows .selected");
    if (open) await openLead(site, open.dataset.session);
  } catch (error) { status(error.message, true); }
}

const CLASSES = [["call_first", "CALL FIRST"], ["nurture", "NURTURE"], ["disqualify", "DISQUALIFY"]];
function showTriage(triage) {
  const site = $("site").value.trim();
  if (triage.status === "failed") {
    $("triageBox").replaceChildren(el("h2", "Triage"), el("div", `the triage failed: ${triage.reason}`, "error"));
    return;
  }
  const out = [el("h2", "Triage"), el("div", `${triage.leads} open leads · ${triage.backend} · ${when(triage.ts)}`, "muted")];
  if (triage.model_error) out.push(el("div", `ranked by each brief's metadata: ${triage.model_error}`, "error"));
  for (const [name, label] of CLASSES) {
    const group = el("div", null, "group"); group.dataset.classification = name;
    group.append(el("h3", label));
    const items = triage.items.filter((item) => item.classification === name);
    if (!items.length) group.append(el("div", "(none)", "muted"));
    for (const item of items) {
      const line = el("div", null, "row"); line.dataset.session = item.session_id;
      line.append(el("div", leadEmails[item.session_id] || item.session_id), el("div", item.reason, "muted"));
      line.addEventListener("click", () => openLead(site, item.session_id));
      group.append(line);
    }
    out.push(group);
  }
  $("triageBox").replaceChildren(...out);
}

async function triage() {
  const site = $("site").value.trim();
  $("triageBox").replaceChildren(el("div", "triage queued, waiting for the enricher…", "muted"));
  try {
    const queued = await api(site, "triage", { method: "POST", body: "{}" });
    showTriage(await until(async () => {
      try {
        const latest = await api(site, "triage");
        return latest.request_id === queued.request_id && latest;
      } catch (error) { if (error.status === 404) return null; throw error; }
    }, "triage"));
  } catch (error) { $("triageBox").replaceChildren(el("div", error.message, "error")); }
}

$("leads").addEventListener("click", loadLeads);
$("rewrite").addEventListener("click", rewriteBriefs);
$("triage").addEventListener("click", triage);
