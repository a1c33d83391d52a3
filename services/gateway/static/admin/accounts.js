import { $, el, status, fieldErrors, problem, showFieldErrors, headerView, siteCall, show, sleep, until, markdown, when } from "./core.js";

(() => {
  // `$`, `el`, `status`, `when`, `sleep`, `markdown`, `headerView`, `problem`, `fieldErrors` and
  // `showFieldErrors` are the page's own (the first script).
  const view = headerView("accountsView", "accounts", "Accounts", () => run(loadAccounts, "accountsErrors"));
  const site = () => $("site").value.trim();
  // A request to site `on` (default: the one typed in). `at`: when the server answered, from its
  // Date header (to the second, so at most a second early; the browser's clock may be far off
  // the server's), what an outcome's `ts` is compared with to tell whether it is newer.
  const call = (method, path, body, type, on) => siteCall(method, path, body, { type, on });
  const account = (id) => `accounts/${encodeURIComponent(id)}`;
  // What the API refused, or the network failing, or a wait running out: said in `box`.
  async function run(action, box) {
    try { await action(); } catch (error) { $(box).textContent = error.message; status(error.message, true); }
  }

  // A wait for the enricher (a search, reports, an edit, a paste) belongs to the site it began on:
  // its requests go there whatever is typed in meanwhile, and it ends quietly once the site
  // changes or the view is left (`live` false): what it would show is no longer on the page, and
  // the other site has none of its work (404s, then a timeout blaming the enricher).
  let sites = 0;  // counts the site changes
  function begin() {
    const on = site(), seen = sites;
    let over = false;
    return { site: on, call: (method, path, body, type) => call(method, path, body, type, on),
             live: () => !over && seen === sites && !view.hidden, end: () => { over = true; },
             left: () => seen === sites };  // ended because the view was left, not the site changed
  }
  // Sleep `ms`, waking early when the wait is over.
  async function pause(wait, ms) {
    for (const end = Date.now() + ms; wait.live() && Date.now() < end;) await sleep(Math.min(500, end - Date.now()));
  }
  // Ask `check` every second until it answers: its answer, or null once the wait is over.
  async function poll(wait, check, what, seconds = 180) {
    const end = Date.now() + seconds * 1000;
    while (wait.live()) {
      let found;
      try { found = await check(); } catch (error) { if (wait.live()) throw error; return null; }
      if (!wait.live()) return null;
      if (found) return found;
      if (Date.now() >= end) throw new Error(`no ${what} after ${seconds} s: is the enricher running?`);
      await pause(wait, 1000);
    }
    return null;
  }
  // GET `path` on the wait's site until `found` says the answer is the one awaited (404: nothing yet).
  const awaited = (wait, path, found, what, seconds) => poll(wait, async () => {
    const answer = await wait.call("GET", path);
    if (answer.status === 404) return null;
    if (answer.status !== 200) throw new Error(problem(answer));
    return found(answer.body) && answer.body;
  }, what, seconds);
  // A wait over because the view was left: `box`, still saying it waits, says it no longer does
  // (a site change cleared it already).
  function unfollowed(wait, box) {
    if (wait.left()) box.append(el("div", "No longer followed: the view was left meanwhile.", "muted"));
  }
  const tested = (node, testid) => { node.dataset.testid = testid; return node; };
  const button = (text, testid) => { const b = tested(el("button", text), testid); b.type = "button"; return b; };

  // --- the portfolio ------------------------------------------------------------------------------

  let rows = [];              // the accounts listed (GET accounts)
  const checked = new Set();  // the accounts checked, kept when the list is drawn again
  const nameOf = (id) => (rows.find((a) => a.id === id) || {}).name || id;
  const money = (amount, currency) => new Intl.NumberFormat(undefined, {
    style: "currency", currency: currency || "USD", maximumFractionDigits: 0 }).format(amount || 0);
  const PROPOSITION = { upsell: "tag good", negotiation: "tag warn", churn: "tag bad", healthy: "tag" };
  const badge = (proposition) => tested(el("span", proposition, PROPOSITION[proposition] || "tag"), "proposition");
  const DAY_MS = 864e5, SOON_DAYS = 90;

  function renewal(date) {
    const cell = el("td", date || "—");
    if (!date) return cell;
    const days = Math.round((new Date(date + "T00:00") - Date.now()) / DAY_MS);
    cell.append(" ", el("span", days < 0 ? `${-days} d ago` : `in ${days} d`, days < SOON_DAYS ? "tag warn" : "muted"));
    return cell;
  }
  // `last_report` of a row: null, or {status, proposition, priority, ts, …}.
  function lastReport(cell, last) {
    if (!last) { cell.replaceChildren("—"); return; }
    const failed = el("span", "failed", "tag bad"); failed.title = last.reason || "";
    cell.replaceChildren(...(last.status === "failed" ? [failed]
      : [badge(last.proposition), el("span", `priority ${last.priority}`, "tag")]), el("span", when(last.ts), "muted"));
  }
  function nameButton(id, name) {
    const open = button(name || nameOf(id), "account-name");
    open.className = "name"; open.title = "read its latest report";
    open.addEventListener("click", () => run(() => openReport(id), "reportErrors"));
    return open;
  }

  function showRows() {
    const open = opened && opened.account;
    $("accountRows").replaceChildren(...rows.map((a) => {
      const tr = tested(el("tr", null, "row"), "account-row"); tr.dataset.account = a.id;
      tr.classList.toggle("selected", a.id === open);
      const box = tested(el("input"), "account-check");
      box.type = "checkbox"; box.checked = checked.has(a.id); box.setAttribute("aria-label", `check ${a.name}`);
      box.addEventListener("change", () => { if (box.checked) checked.add(a.id); else checked.delete(a.id); counted(); });
      const near = el("td");
      for (const metric of a.near_limit) near.append(el("span", metric.replaceAll("_", " "), "tag warn"));
      const last = tested(el("td"), "last-report");
      lastReport(last, a.last_report);
      const pick = el("td"), name = el("td");
      pick.append(box); name.append(nameButton(a.id, a.name));
      tr.append(pick, name, el("td", a.tier), el("td", money(a.arr, a.currency), "num"), renewal(a.renewal_date), near, last);
      return tr;
    }));
    if (!rows.length) {
      const none = el("td", "No accounts yet: import them (concierge accounts import, or POST accounts/import).", "muted");
      const tr = el("tr"); none.colSpan = 7; tr.append(none);
      $("accountRows").append(tr);
    }
    counted();
  }
  function counted() {
    $("accountsChecked").textContent = checked.size ? `${checked.size} checked` : "none checked";
    $("accountsAll").checked = rows.length > 0 && rows.every((a) => checked.has(a.id));
  }
  $("accountsAll").addEventListener("change", () => {
    for (const a of rows) if ($("accountsAll").checked) checked.add(a.id); else checked.delete(a.id);
    showRows();
  });

  let loading = 0;
  async function loadAccounts() {
    const mine = ++loading;
    $("accountsWhich").textContent = site();
    $("accountsErrors").textContent = "";
    // A page at a time (the API lists at most 500 rows a request), shown once all are in.
    const found = [];
    let answer, offset = 0;
    do {
      answer = await call("GET", `accounts?limit=500&offset=${offset}`);
      if (mine !== loading) return;  // an earlier read answering late
      if (answer.status !== 200) { $("accountsErrors").textContent = problem(answer); return; }
      found.push(...answer.body.accounts);
      offset = answer.body.next_offset;
    } while (offset !== null && offset !== undefined);
    const pull = answer.body.pull;
    if (pull && pull.error) $("accountsErrors").textContent = `the accounts could not be pulled from the site's CRM: ${pull.error}`;
    rows = found;
    for (const id of [...checked]) if (!rows.some((a) => a.id === id)) checked.delete(id);
    showRows();
    status(`${rows.length} accounts`);
  }

  // --- opportunities: the checked accounts (or all) ranked; the best candidates checked ------------

  // Only the newest search is shown (GET accounts/opportunities): one written since ours was asked
  // for that is not ours (another operator's, another window's) may hide ours for good, so it is
  // shown instead, said so, and the wait ends.
  async function findOpportunities() {
    const box = $("opportunities"), chosen = rows.filter((a) => checked.has(a.id)).map((a) => a.id), wait = begin();
    $("accountsErrors").textContent = "";
    box.replaceChildren(el("h3", "Opportunities"), el("div", `ranking ${chosen.length ? `${chosen.length} account${chosen.length === 1 ? "" : "s"}` : "every account"}, waiting for the enricher…`, "muted"));
    const queued = await wait.call("POST", "accounts/opportunities", chosen.length ? { accounts: chosen } : {});
    if (!wait.live()) { unfollowed(wait, box); return; }
    if (queued.status !== 202) { box.replaceChildren(el("h3", "Opportunities"), el("div", problem(queued), "error")); return; }
    const request = queued.body.request_id;
    const found = await awaited(wait, "accounts/opportunities", (o) => o.request_id === request || o.ts > queued.at, "opportunities");
    if (!found) { unfollowed(wait, box); return; }
    showOpportunities(found, found.request_id !== request);
  }

  function showOpportunities(found, newer) {
    const out = [el("h3", "Opportunities")];
    if (newer) out.push(tested(el("div", "A newer search (written since this one was asked for: another operator's, "
                                         + "or another window's) is the site's newest: it is the one shown.", "muted"),
                               "opportunities-newer"));
    if (found.status === "failed") {
      out.push(el("div", `the search failed: ${found.reason || found.model_error}`, "error"));
      $("opportunities").replaceChildren(...out);
      return;
    }
    out.push(el("div", `${found.items.length} accounts, best opportunity first · ${found.backend === "data" ? "ranked by the rules over their figures" : "ranked by the model"} · ${when(found.ts)}`, "muted"));
    if (found.model_error) out.push(el("div", `the model's ranking was not used: ${found.model_error}`, "error"));
    out.push(tested(el("div", `pre-selected: ${found.selected.length} best candidates (checked in the table: "Generate reports" writes their reports)`, "muted"), "opportunities-selected"));
    const list = el("ol", null, "ranked");
    for (const item of found.items) {
      const line = tested(el("li"), "opportunity"); line.dataset.account = item.account_id;
      line.append(nameButton(item.account_id, item.name), " ", badge(item.proposition));
      if (item.selected) line.append(el("span", "pre-selected", "tag good"));
      line.append(tested(el("div", item.reason, "muted"), "opportunity-reason"));
      list.append(line);
    }
    out.push(list);
    $("opportunities").replaceChildren(...out);
    checked.clear();
    for (const id of found.selected) checked.add(id);
    showRows();
    status(`${found.items.length} accounts ranked, ${found.selected.length} pre-selected`);
  }

  // --- reports for the checked accounts: each one's progress, until its report is written ---------

  // Report `request` of account `id`, from the account's list of reports (GET …/reports: every one,
  // oldest first, so ours is found even when a newer one is the latest): {ours, newest} once it
  // is written or failed; {newest} when it is not but another, written since `at` (when ours
  // was asked for: another operator's, another window's), is the account's latest now, and the
  // wait ends on it; null while neither.
  async function reportOf(wait, id, request, at) {
    const answer = await wait.call("GET", `${account(id)}/reports`);
    if (answer.status !== 200) throw new Error(problem(answer));
    const all = answer.body.reports, newest = all[all.length - 1];
    const ours = all.findLast((r) => r.request_id === request);
    if (ours) return { ours, newest };
    return newest && newest.ts > at ? { newest } : null;
  }
  // A line of GET …/reports as the table's last report (`last_report` of GET accounts).
  const asLast = (r) => r.status === "failed" ? { status: "failed", ts: r.ts, reason: r.reason }
    : { status: "completed", ts: r.ts, ...r.metadata };

  // Each account's report read in turn, REPORT_READS at a time however many are checked (all of
  // thousands), an account again after a second, or after pending/REPORT_READS seconds once many
  // are pending (some REPORT_READS reads a second in all). The wait fails when no report is
  // written for REPORT_QUIET_S seconds, not after a fixed time: a thousand take long.
  const REPORT_READS = 4, REPORT_QUIET_S = 300;
  async function generateReports() {
    const chosen = rows.filter((a) => checked.has(a.id)).map((a) => a.id), wait = begin();
    $("accountsErrors").textContent = "";
    if (!chosen.length) { $("accountsErrors").textContent = "Check the accounts to report on (“Find opportunities” checks the best candidates)."; return; }
    const queued = await wait.call("POST", "accounts/reports", { accounts: chosen });
    if (!wait.live()) return;
    if (queued.status !== 202) { $("accountsErrors").textContent = problem(queued); return; }
    const request = queued.body.request_id, ids = queued.body.accounts, lines = {};
    $("reportProgress").replaceChildren(el("h3", "Reports"), ...ids.map((id) => {
      const line = tested(el("div", null, "row"), "report-progress"); line.dataset.account = id;
      line.append(nameButton(id), " ", el("span", "writing…", "tag"));
      return (lines[id] = line);
    }));
    status(`writing ${ids.length} reports…`);
    const queue = [...ids], pending = new Set(ids), due = new Map(ids.map((id) => [id, 0]));
    let heard = Date.now();  // the last report written (or the start)
    async function reader() {
      while (queue.length && wait.live()) {
        if (Date.now() - heard > REPORT_QUIET_S * 1000) throw new Error(`no report written for ${REPORT_QUIET_S} s: is the enricher running?`);
        const id = queue.shift();
        await pause(wait, due.get(id) - Date.now());
        if (!wait.live()) return;
        let found;
        try { found = await reportOf(wait, id, request, queued.at); } catch (error) { if (wait.live()) throw error; return; }
        if (!wait.live()) return;
        if (!found) {
          due.set(id, Date.now() + 1000 * Math.max(1, pending.size / REPORT_READS));
          queue.push(id);
          continue;
        }
        pending.delete(id); heard = Date.now();
        written(lines[id], id, found);
        status(`${ids.length - pending.size} of ${ids.length} reports written`);
      }
    }
    try {
      await Promise.all(Array.from({ length: Math.min(REPORT_READS, ids.length) }, reader));
    } catch (error) {
      wait.end();  // the other readers stop too
      throw error;
    }
    if (pending.size && !wait.live()) unfollowed(wait, $("reportProgress"));
  }

  // An account's report arrived (reportOf): its progress line, and its table row the newest report.
  // Ours not written but a newer one: "superseded", and the newer one.
  function written(line, id, { ours, newest }) {
    const shown = ours || newest, failed = shown.status === "failed";
    const tag = ours ? el("span", failed ? "failed" : "done", failed ? "tag bad" : "tag good")
      : tested(el("span", "superseded", "tag warn"), "report-superseded");
    if (!ours) tag.title = "another report of the account (another operator's, or another window's), written since this one was asked for, is its latest: it is shown";
    line.replaceChildren(nameButton(id), " ", tag, " ");
    if (failed) line.append(el("span", shown.reason, "error"));
    else lastReport(line.appendChild(el("span")), asLast(shown));
    const row = rows.find((a) => a.id === id);
    if (!row) return;
    row.last_report = asLast(newest);
    lastReport($("accountRows").querySelector(`tr[data-account="${CSS.escape(id)}"] [data-testid=last-report]`), row.last_report);
  }

  // --- a report: its current view, its sections editable, its history ---------------------------

  let opened = null;  // {account, request, view}: the report shown (a new object per opening)
  const reportPath = (shown) => `${account(shown.account)}/reports/${encodeURIComponent(shown.request)}`;

  // The metadata line and the numbers warning of a view (CURRENT VIEW: routes/accounts.py).
  function reportMeta(report) {
    const m = report.metadata, line = tested(el("div", null, "muted"), "report-meta");
    line.append(badge(m.proposition), el("span", `success ${m.success_percent}%`, "tag"), el("span", `priority ${m.priority}`, "tag"));
    if (report.backend === "data") {
      const label = tested(el("span", "data-only", "tag warn"), "data-only");
      label.title = "built from the account's figures without a language model: every number is from its data";
      line.append(label);
    }
    if (report.verdict) line.append(el("span", `verdict ${report.verdict}`, report.verdict === "pass" ? "tag good" : "tag bad"));
    line.append(` version ${report.version} of ${report.versions} · written ${when(report.ts)}`);
    if (report.version > 1) line.append(` · this version ${when(report.edited_ts)}`);
    const out = [line];
    if (report.numbers_warning) {
      const warning = tested(el("div", "More than half of the account's figures are missing from the report: ", "error"), "numbers-warning");
      for (const n of report.missing_numbers) warning.append(el("span", n, "tag bad"));
      out.push(warning);
    }
    return out;
  }

  function sectionBox(section, editable) {
    const box = tested(el("article", null, "report-section"), "report-section"); box.dataset.section = section.name;
    const head = el("h3");
    head.append(el("span", section.name));
    if (section.hand_edited) head.append(tested(el("span", "edited by hand", "tag warn"), "hand-edited"));
    const text = tested(el("div"), "section-text");
    text.append(markdown(section.text));
    if (editable) {
      const edit = button("Edit", "section-edit"); edit.setAttribute("aria-label", `Edit ${section.name}`);
      edit.addEventListener("click", () => { edit.hidden = true; editSection(box, section, text, edit); });
      head.append(edit);
    }
    box.append(head, text);
    return box;
  }

  async function openReport(id, request) {
    const mine = opened = { account: id, request };
    for (const tr of $("accountRows").rows) tr.classList.toggle("selected", tr.dataset.account === id);
    $("reportWhich").textContent = nameOf(id);
    $("reportErrors").textContent = "";
    $("reportMeta").replaceChildren(el("div", "loading…", "muted"));
    for (const box of ["reportSections", "salesScript", "reportHistory", "reportDiff"]) $(box).replaceChildren();
    $("reportAsk").hidden = true;
    const answer = await call("GET", request ? reportPath(mine) : `${account(id)}/reports/latest`);
    if (opened !== mine) return;  // another report was opened meanwhile
    if (answer.status === 404) { $("reportMeta").replaceChildren(el("div", "No report yet: check the account and “Generate reports”.", "muted")); return; }
    if (answer.status !== 200) { $("reportMeta").replaceChildren(el("div", problem(answer), "error")); return; }
    if (!request && answer.body.type === "account_report_failed") {
      const e = answer.body.event;
      $("reportMeta").replaceChildren(el("div", `The latest report failed (${e.node}, ${e.attempts} attempts, ${when(e.ts)}): ${e.reason}`, "error"));
      return;
    }
    const report = request ? answer.body : answer.body.report;
    mine.request = report.request_id; mine.view = report;
    $("reportMeta").replaceChildren(...reportMeta(report));
    $("reportSections").replaceChildren(...report.sections.map((s) => sectionBox(s, report.editable)));
    if (!report.editable) $("reportSections").append(el("div", "This report was written before reports kept their "
      + "sections apart: it cannot be edited. Generate it again to edit it.", "muted"));
    $("salesScript").replaceChildren(markdown(report.sales_script));
    showFieldErrors($("reportAsk"), [], $("reportErrors"));
    $("reportAsk").hidden = !report.editable;
    await showHistory(mine);
  }

  // A section edited in place: its text in a textarea, saved on the version shown.
  function editSection(box, section, text, edit) {
    const form = tested(el("form"), "section-form"); form.noValidate = true;
    form.setAttribute("aria-label", `${section.name}, edited by hand`);
    const field = el("label", null, "field"); field.dataset.field = "text";
    const area = tested(el("textarea"), "section-textarea");
    area.rows = Math.min(18, Math.max(4, section.text.split("\n").length + 1)); area.value = section.text;
    const error = el("span", null, "field-error"); error.id = `sectionError-${section.name.replace(/\W/g, "")}`;
    area.setAttribute("aria-describedby", error.id);
    field.append(el("span", `${section.name} (Markdown)`), area, error);
    const save = tested(el("button", "Save"), "section-save"); save.type = "submit";
    const cancel = button("Cancel", "section-cancel");
    const general = el("div", null, "error"); general.setAttribute("role", "alert");
    form.append(field, save, " ", cancel, general);
    cancel.addEventListener("click", () => { form.replaceWith(text); edit.hidden = false; });
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      save.disabled = true;
      run(() => change({ section: section.name, text: area.value, base_version: opened.view.version }, form, general), "reportErrors")
        .finally(() => { save.disabled = false; });
    });
    text.replaceWith(form);
    area.focus();
  }

  // An edit, by hand or asked for in words: queued, waited for, then the report read again at its
  // new version. A refusal shows beside its field, a failure's reason in `general`.
  async function change(body, form, general) {
    const shown = opened, edits = `${reportPath(shown)}/edits`, wait = begin();
    showFieldErrors(form, [], general);
    const queued = await wait.call("POST", edits, body);
    if (!wait.live()) return false;
    if (queued.status !== 202) {
      showFieldErrors(form, queued.status === 422 ? fieldErrors(queued) : [], general);
      if (queued.status !== 422) general.textContent = problem(queued);
      return false;
    }
    status("editing the report, waiting for the enricher…");
    const done = await awaited(wait, `${edits}/${encodeURIComponent(queued.body.edit_id)}`, (e) => e.status !== "pending", "edit");
    if (!done) return false;
    if (done.status === "failed") { general.textContent = `Not changed: ${done.reason}`; status("the report was not changed", true); return false; }
    status(`version ${done.version}: ${done.changed.join(", ")} changed` +
           (done.ignored.length ? `; ${done.ignored.join(", ")} kept as edited by hand` : ""));
    if (opened === shown) await openReport(shown.account, shown.request);
    return true;
  }

  $("reportAsk").addEventListener("submit", (e) => {
    e.preventDefault();
    $("reportAskSend").disabled = true;
    run(async () => {
      if (await change({ instruction: $("reportInstruction").value }, $("reportAsk"), $("reportErrors"))) $("reportInstruction").value = "";
    }, "reportErrors").finally(() => { $("reportAskSend").disabled = false; });
  });

  // --- history: every version (newest first); two checked show what changed between them --------

  const HOW = { generated: "generated", hand: "by hand", asked: "asked" };
  const EDITOR = { llm: "the model", data: "the rule editor" };  // who made an asked change
  async function showHistory(shown) {
    const answer = await call("GET", `${reportPath(shown)}/versions`);
    if (opened !== shown) return;
    if (answer.status !== 200) { $("reportHistory").replaceChildren(el("div", problem(answer), "error")); return; }
    const compared = [];  // the versions checked, in the order checked
    $("reportHistory").replaceChildren(...[...answer.body.versions].reverse().map((v) => {
      const line = tested(el("label", null, "version"), "report-version"); line.dataset.version = v.version;
      const box = el("input"); box.type = "checkbox";
      box.addEventListener("change", () => {
        if (box.checked) compared.push(v.version); else compared.splice(compared.indexOf(v.version), 1);
        if (compared.length > 2) $("reportHistory").querySelector(`[data-version="${compared.shift()}"] input`).checked = false;
        if (compared.length === 2) run(() => showDiff(shown, Math.min(...compared), Math.max(...compared)), "reportErrors");
        else $("reportDiff").replaceChildren();
      });
      line.append(box, el("b", ` version ${v.version} `), el("span", HOW[v.how] || v.how, "tag"), ` ${when(v.ts)} · ${v.actor}`);
      if (v.instruction) line.append(el("div", `“${v.instruction}”` + (EDITOR[v.backend] ? ` (${EDITOR[v.backend]})` : "")));
      if (v.sections.length) line.append(el("div", `${v.how === "generated" ? "sections" : "changed"}: ${v.sections.join(", ")}`, "muted"));
      if (v.hand_edited.length) line.append(el("div", `edited by hand: ${v.hand_edited.join(", ")}`, "muted"));
      if (v.ignored.length) line.append(el("div", `left as edited by hand (the change did not name them): ${v.ignored.join(", ")}`, "muted"));
      return line;
    }));
  }

  async function showDiff(shown, from, to) {
    const answer = await call("GET", `${reportPath(shown)}/diff?from=${from}&to=${to}`);
    if (opened !== shown) return;
    if (answer.status !== 200) { $("reportDiff").replaceChildren(el("div", problem(answer), "error")); return; }
    const d = answer.body, out = [el("h3", `From version ${d.from} to version ${d.to}`)];
    for (const s of d.sections) {
      const box = tested(el("div"), "diff-section"); box.dataset.section = s.section;
      box.append(el("h4", s.section), el("pre", s.before, "diff-old"), el("pre", s.after, "diff-new"));
      out.push(box);
    }
    if (!d.sections.length) out.push(el("div", "No section changed.", "muted"));
    const unified = el("details"), lines = tested(el("pre"), "diff-unified");
    for (const line of d.unified.split("\n")) {
      const added = line.startsWith("+") && !line.startsWith("+++"), removed = line.startsWith("-") && !line.startsWith("---");
      lines.append(el("span", line + "\n", added ? "diff-new" : removed ? "diff-old" : null));
    }
    unified.append(el("summary", "the unified diff"), lines);
    $("reportDiff").replaceChildren(...out, unified);
  }

  // --- paste your data: one account (JSON or free text) in, its report out (read-only) -----------

  const PLACEHOLDER = {
    json: '{"name": "Acme Heating", "tier": "Growth", "arr": 48000, "currency": "USD", "renewal_date": "2027-03-31",\n' +
          ' "usage": {"technician_seats": {"current": 58, "limit": 60, "unit": "seats"}}}',
    text: "Acme Heating, Growth tier, 48,000 USD a year, renews on 2027-03-31. 58 of 60 technician seats used." };
  const pasteFormat = () => ($("pasteJson").checked ? "json" : "text");
  for (const id of ["pasteJson", "pasteText"]) $(id).addEventListener("change", () => { $("pasteBody").placeholder = PLACEHOLDER[pasteFormat()]; });
  $("pasteBody").placeholder = PLACEHOLDER.json;

  function pasteErrors(errors) {
    $("pasteErrors").replaceChildren(...errors.map((e) => {
      const item = tested(el("li", (e.field ? e.field + ": " : "") + e.message), "paste-error"); item.dataset.field = e.field || "";
      return item;
    }));
    if (errors.length) $("pasteBody").setAttribute("aria-invalid", "true"); else $("pasteBody").removeAttribute("aria-invalid");
  }

  function pastedAccount(a) {
    const box = tested(el("div"), "pasted-account");
    box.append(el("h3", "Read from what you pasted"),
               el("div", `${a.name} · ${a.tier || "no tier"} · ${money(a.arr, a.currency)} a year · renews ${a.renewal_date || "—"}`));
    const table = el("table"), head = el("tr");
    for (const h of ["metric", "current", "limit", "unit"]) head.append(el("th", h));
    table.append(head);
    for (const m of a.usage || []) {
      const tr = el("tr", null, "row");
      tr.append(el("td", m.metric), el("td", m.current, "num"), el("td", m.limit ?? "—", "num"), el("td", m.unit));
      table.append(tr);
    }
    box.append(table);
    return box;
  }

  async function paste() {
    const wait = begin();
    pasteErrors([]);
    $("pasteAccount").replaceChildren(); $("pasteReport").replaceChildren();
    const answer = await wait.call("POST", "accounts/paste", $("pasteBody").value,
                                   pasteFormat() === "json" ? "application/json" : "text/plain");
    if (!wait.live()) return;
    if (answer.status === 422) { pasteErrors(fieldErrors(answer)); status("not read: see what is wrong", true); return; }
    if (answer.status !== 202) { pasteErrors([{ message: problem(answer) }]); return; }
    const { account_id: id, request_id: request } = answer.body;
    $("pasteAccount").replaceChildren(pastedAccount(answer.body.account));
    $("pasteReport").replaceChildren(el("div", "writing its report, waiting for the enricher…", "muted"));
    const found = await poll(wait, () => reportOf(wait, id, request, answer.at), "report", 300);
    if (!found) { unfollowed(wait, $("pasteReport")); return; }
    const shown = found.ours || found.newest;
    const newer = found.ours ? [] : [el("div", "The same account was pasted again since, and that report is its latest: "
                                                + "it is the one shown.", "muted")];
    if (shown.status === "failed") {
      $("pasteReport").replaceChildren(...newer, el("div", `The report failed: ${shown.reason}`, "error"));
      return;
    }
    const full = await wait.call("GET", `${account(id)}/reports/${encodeURIComponent(shown.request_id)}`);
    if (!wait.live()) { unfollowed(wait, $("pasteReport")); return; }
    if (full.status !== 200) throw new Error(problem(full));
    const report = full.body, out = tested(el("div"), "pasted-report");
    out.append(el("h3", "Its report"), ...newer, ...reportMeta(report), ...report.sections.map((s) => sectionBox(s, false)),
               el("h3", "Sales script"), markdown(report.sales_script));
    $("pasteReport").replaceChildren(out);
    status(`the report of ${answer.body.account.name} is written`);
  }

  $("pasteForm").addEventListener("submit", (e) => {
    e.preventDefault();
    $("pasteSend").disabled = true;
    run(paste, "pasteReport").finally(() => { $("pasteSend").disabled = false; });
  });
  // Each disabled while its wait runs: a second click (a double click) asks for nothing twice.
  for (const [id, action] of [["accountsFind", findOpportunities], ["accountsGenerate", generateReports]]) {
    $(id).addEventListener("click", () => {
      $(id).disabled = true;
      run(action, "accountsErrors").finally(() => { $(id).disabled = false; });
    });
  }
  $("site").addEventListener("change", () => {
    sites++;  // every wait begun on the site before ends
    if (view.hidden) return;
    checked.clear(); opened = null;
    for (const box of ["reportProgress", "opportunities", "reportSections", "salesScript", "reportHistory", "reportDiff",
                       "pasteAccount", "pasteReport"]) $(box).replaceChildren();
    $("reportMeta").replaceChildren(el("div", "Click an account's name to read its latest report.", "muted"));
    $("reportWhich").textContent = ""; $("reportAsk").hidden = true;
    run(loadAccounts, "accountsErrors");
  });
})();
