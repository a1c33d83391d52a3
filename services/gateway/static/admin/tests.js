// Tests: the site's own test cases and their runs (services/gateway/routes/evals.py): each run
// with its pass rate, the cases it found newly failing beside what they answered before, and a
// case saved from a conversation's turn ("Save turn N as a test case" in the timeline: caseForm).
import { $, el, status, problem, fieldErrors, showFieldErrors, headerView, siteCall, linkTo, sleep, when } from "./core.js";

const INTENTS = ["LEARN", "CONTEXT", "SUPPORT", "OFFTOPIC", "OTHER", "BOOKING", "STOP_BOOKING", "HACK"];
const ROUTES = ["ANSWER", "REDIRECT", "BOOKING", "HANDOFF"];
const REASONS = { operator: "run by hand", sync: "after a knowledge change", config: "after a settings change" };
const site = () => $("site").value.trim();

const call = siteCall;

let openRun = null;
headerView("testsView", "tests", "Tests", () => {
  const linked = /\/tests\/(run-[0-9a-f]{12})$/.exec(location.hash);  // #/sites/<site>/tests/<run>
  if (linked) openRun = linked[1];
  loadTests();
});

async function loadTests() {
  $("testsWhich").textContent = site();
  status("loading tests…");
  const [runs, cases] = await Promise.all([call("GET", "evals/runs"), call("GET", "evals/cases")]);
  if (!runs.ok || !cases.ok) { status(problem(runs.ok ? cases : runs), true); return; }
  showRuns(runs.body.runs);
  showCases(cases.body.cases);
  status(`${cases.body.cases.length} cases, ${runs.body.runs.length} runs`);
  if (openRun) await showRun(openRun);
  return runs.body.runs;
}

function showRuns(runs) {
  const rows = $("runRows"); rows.replaceChildren();
  if (!runs.length) rows.append(rowOf([el("td", "No run yet.", "muted")]));
  for (const run of runs) {
    const passed = run.state === "running" ? el("span", "running…", "tag")
      : run.state === "failed" ? el("span", "could not finish", "tag bad")
      : el("span", `${run.passed} of ${run.cases}`, run.failed.length ? "tag bad" : "tag good");
    const newly = el("td", run.newly_failing?.length ? `${run.newly_failing.length} newly failing` : "", run.newly_failing?.length ? "error" : "muted");
    const tr = rowOf([el("td", when(run.requested_at)), el("td", REASONS[run.reason] || run.reason), cell(passed),
                      el("td", run.pass_rate === null || run.pass_rate === undefined ? "" : `${Math.round(run.pass_rate * 100)} %`), newly]);
    tr.classList.add("row"); tr.dataset.run = run.run; tr.tabIndex = 0; tr.setAttribute("role", "button");
    tr.setAttribute("aria-pressed", String(run.run === openRun));
    if (run.run === openRun) tr.classList.add("selected");
    const open = () => showRun(run.run);
    tr.addEventListener("click", open);
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
    rows.append(tr);
  }
}

function rowOf(cells) { const tr = el("tr"); tr.append(...cells); return tr; }
function cell(child) { const td = el("td"); td.append(child); return td; }

function expectations(expect) {
  const out = [];
  if (expect.intent) out.push(`intent ${expect.intent}`);
  if (expect.route) out.push(`route ${expect.route}`);
  for (const fact of expect.facts || []) out.push(`says “${fact.join(" / ")}”`);
  for (const phrase of expect.forbidden || []) out.push(`never “${phrase}”`);
  for (const page of expect.pages || []) out.push(`cites ${page}`);
  if (expect.decline) out.push("declines");
  return out.join(" · ");
}

function showCases(cases) {
  $("casesCount").textContent = `(${cases.length})`;
  const box = $("caseRows"); box.replaceChildren();
  if (!cases.length) box.append(el("div", "No case yet: open a conversation and save one of its turns.", "muted"));
  for (const c of cases) {
    const row = el("div", null, "case");
    const retire = el("button", "Retire"); retire.type = "button";
    retire.setAttribute("aria-label", `Retire the case “${c.message.slice(0, 40)}”`);
    retire.addEventListener("click", async () => {
      const answer = await call("DELETE", `evals/cases/${c.id}`);
      if (!answer.ok) { status(problem(answer), true); return; }
      await loadTests();
    });
    row.append(el("div", c.message), el("div", expectations(c.expect), "muted"), retire);
    box.append(row);
  }
}

async function showRun(run) {
  openRun = run;
  linkTo("tests", run);
  for (const tr of document.querySelectorAll("#runRows tr.row")) {
    tr.classList.toggle("selected", tr.dataset.run === run);
    tr.setAttribute("aria-pressed", String(tr.dataset.run === run));
  }
  const answer = await call("GET", `evals/runs/${run}`);
  if (!answer.ok) { $("runDetail").replaceChildren(el("div", problem(answer), "error")); return; }
  const detail = answer.body.run;
  $("runWhich").textContent = `${run} · ${REASONS[detail.reason] || detail.reason} · ${when(detail.requested_at)}`;
  const before = {};
  if (detail.newly_failing?.length && detail.previous_run) {
    const previous = await call("GET", `evals/runs/${detail.previous_run}`);
    for (const r of previous.ok ? previous.body.run.results : []) before[r.case_id] = r;
  }
  const out = [];
  if (detail.state === "running") out.push(el("div", `running: ${detail.results.length} cases judged so far`, "muted"));
  if (detail.error) out.push(el("div", `the run could not finish: ${detail.error}`, "error"));
  if (detail.newly_failing?.length) {
    // The change that caused it: the view that shows it (the sources' runs, the settings' versions).
    const [why, button] = { sync: ["Knowledge", "knowledge"], config: ["Settings", "siteSettings"] }[detail.reason] || [];
    const n = detail.newly_failing.length;
    const line = el("div", `${n} ${n === 1 ? "case" : "cases"} passed in the run before and ${n === 1 ? "fails" : "fail"} now.`, "error");
    if (why) {
      const open = el("button", `See what changed in ${why}`); open.type = "button";
      open.addEventListener("click", () => $(button).click());
      line.append(" ", open);
    }
    out.push(line);
  }
  const ordered = [...detail.results].sort((a, b) => (a.passed - b.passed) ||
    (detail.newly_failing.includes(b.case_id) - detail.newly_failing.includes(a.case_id)));
  for (const result of ordered) {
    const newly = detail.newly_failing.includes(result.case_id);
    out.push(resultBox(result, newly ? before[result.case_id] : undefined, newly));
  }
  $("runDetail").replaceChildren(...out);
}

function resultBox(result, before, newly) {
  const box = el("div", null, "result"); box.dataset.case = result.case_id;
  const head = el("div");
  head.append(el("span", result.passed ? "pass" : "fail", result.passed ? "tag good" : "tag bad"));
  if (newly) head.append(el("span", "newly failing", "tag bad"));
  head.append(el("b", ` ${result.message}`), el("span", ` ${result.intent || ""} ${result.route || ""}`, "muted"));
  box.append(head);
  if (result.failures.length) {
    const list = el("ul", null, "error");
    for (const failure of result.failures) list.append(el("li", failure));
    box.append(list);
  }
  if (before) {
    const sides = el("div", null, "side-by-side");
    const was = el("div", null, "diff-old"); was.append(el("div", "before", "muted"), el("div", before.answer || "(no answer)"));
    const now = el("div", null, "diff-new"); now.append(el("div", "now", "muted"), el("div", result.answer || "(no answer)"));
    sides.append(was, now);
    box.append(sides);
  } else {
    box.append(el("div", result.answer || "(no answer)", "answer"));
  }
  if (result.cited?.length) box.append(el("div", `cites ${result.cited.join(", ")}`, "muted"));
  return box;
}

$("runTests").addEventListener("click", async () => {
  const started = await call("POST", "evals/runs");
  if (!started.ok) { $("runsNotice").textContent = problem(started); $("runsNotice").className = "error"; return; }
  const run = started.body.run.run;
  $("runsNotice").className = "muted";
  $("runsNotice").textContent = "running the cases…";
  openRun = run;
  for (let i = 0; i < 600; i++) {
    const runs = await loadTests();
    const mine = (runs || []).find((r) => r.run === run);
    if (mine && mine.state !== "running") {
      $("runsNotice").textContent = `done: ${mine.passed ?? 0} of ${mine.cases ?? 0} passed`;
      return;
    }
    await sleep(1000);
  }
});

// "Save turn N as a test case" for a visitor's turn in a conversation's timeline (conversations.js):
// what should have happened, into `parent`; `guess` ({intent, route}) pre-fills the choices
// with what did happen.
function caseForm(parent, session, turn, message, guess = {}) {
  const form = el("form", null, "case-form"); form.noValidate = true;
  const field = (name, label, input) => {
    const box = el("label", null, "field"); box.dataset.field = name;
    box.append(el("span", label), input, el("span", "", "field-error"));
    return box;
  };
  const select = (options, chosen) => {
    const s = el("select"); s.append(new Option("(any)", ""));
    for (const o of options) s.append(new Option(o, o, false, o === chosen));
    return s;
  };
  const intent = select(INTENTS, guess.intent), route = select(ROUTES, guess.route);
  const facts = el("textarea"); facts.rows = 3; facts.placeholder = "one fact a line; spellings split by |, e.g. $59 | 59 dollars";
  const pages = el("textarea"); pages.rows = 2; pages.placeholder = "https://… one page a line";
  const decline = el("input"); decline.type = "checkbox";
  const note = el("input"); note.size = 40;
  const save = el("button", "Save the case"); save.type = "submit";
  const general = el("div", "", "error"); general.setAttribute("role", "alert");
  form.append(el("h3", `Test case from turn ${turn}`), el("div", `“${message}”`, "muted"),
              field("expect.intent", "Intent", intent), field("expect.route", "Route", route),
              field("expect.facts", "The answer says", facts), field("expect.pages", "It cites", pages),
              field("expect.decline", "It should decline (say it does not know)", decline), field("note", "Note", note),
              save, general);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const lines = (text) => text.split("\n").map((l) => l.trim()).filter(Boolean);
    const expect = { intent: intent.value, route: route.value, decline: decline.checked,
                     facts: lines(facts.value).map((l) => l.split("|").map((s) => s.trim()).filter(Boolean)),
                     pages: lines(pages.value) };
    const answer = await call("POST", "evals/cases", { from_session: session, from_turn: turn, expect, note: note.value });
    if (!answer.ok) { showFieldErrors(form, fieldErrors(answer), general); if (!fieldErrors(answer).length) general.textContent = problem(answer); return; }
    showFieldErrors(form, [], general);
    form.replaceChildren(el("div", `Saved as ${answer.body.case.id} (version ${answer.body.case.version}): it runs with the site's other cases in Tests.`, "notice"));
  });
  parent.replaceChildren(form);
  intent.focus();
}

export { caseForm, loadTests };
