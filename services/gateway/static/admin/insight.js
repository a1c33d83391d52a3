import { $, el, status, fieldErrors, problem, showFieldErrors, headerView, adminFetch, siteCall, until, when } from "./core.js";
import { loadList, openConversation } from "./conversations.js";

(() => {
  // `$`, `el`, `status`, `headerView`, `problem`, `fieldErrors`, `showFieldErrors`, `loadList` and
  // `openConversation` are the page's own (the first script).
  const view = headerView("insightView", "insight", "Insight", () => loadInsight());
  const site = () => $("site").value.trim();
  const headers = () => ({ "Content-Type": "application/json" });
  const url = (path) => `/v1/admin/sites/${encodeURIComponent(site())}/${path}`;
  const call = siteCall;
  // A 422's fields, whichever name the error handler gave them (errors.py: `errors`, `detail`).

  // --- the filters: the range (a preset, or two dates made into durations ago, which is what
  // the API takes), the language and the route; any change reloads -----------------------------

  const DAY_S = 86400;
  const languages = new Set();
  function range() {
    if ($("insightRange").value !== "dates") return { query: { since: $("insightRange").value }, errors: [] };
    const now = Date.now(), errors = [], query = {};
    const from = $("insightFrom").value && new Date($("insightFrom").value + "T00:00");
    const to = $("insightTo").value && new Date($("insightTo").value + "T00:00");
    if (!from) errors.push({ field: "from", message: "the first day" });
    else if (from >= now) errors.push({ field: "from", message: "a day in the past" });
    else query.since = String(Math.ceil((now - from) / 1000));
    if (to && from && to < from) errors.push({ field: "until", message: "on or after the first day" });
    else if (to && to.getTime() + DAY_S * 1000 < now) query.until = String(Math.floor((now - to.getTime()) / 1000) - DAY_S);
    return { query, errors };
  }
  function filters() {
    const { query, errors } = range();
    if ($("insightLanguage").value) query.language = $("insightLanguage").value;
    if ($("insightRoute").value) query.route = $("insightRoute").value;
    return { query, errors };
  }
  $("insightRange").addEventListener("change", () => {
    const dates = $("insightRange").value === "dates";
    for (const field of ["from", "until"]) view.querySelector(`#insightFilters [data-field=${field}]`).hidden = !dates;
    if (!dates || $("insightFrom").value) loadInsight();
  });
  for (const id of ["insightFrom", "insightTo"]) $(id).addEventListener("change", () => { if ($("insightFrom").value) loadInsight(); });
  for (const id of ["insightLanguage", "insightRoute"]) $(id).addEventListener("change", loadInsight);
  $("site").addEventListener("change", () => {
    if (view.hidden) return;
    languages.clear(); listed = null;
    park();
    $("behindWhich").textContent = "";
    $("insightConversations").replaceChildren(el("div", "Click a number to list the conversations behind it.", "muted"));
    loadInsight();
  });

  // --- the figures -------------------------------------------------------------------------------

  const percent = (rate) => rate === null || rate === undefined ? "–" : `${Math.round(rate * 100)}%`;
  const ms = (value) => value === null || value === undefined ? "–" : `${Math.round(value)} ms`;
  // [key, label, what a click shows (insight/conversations' filter, or a function; null: the
  // number is not clickable), definition (its tooltip), format]
  const HEADLINE = [
    ["conversations", "conversations", {}, "conversations started in the range"],
    ["answered", "answered", { turn_outcome: "answered" }, "turns answered citing the knowledge base"],
    ["not_found", "not found", { turn_outcome: "not_found" }, "turns routed to an answer that cites no source"],
    ["redirected", "redirected", { turn_outcome: "redirected" }, "turns answered by pointing elsewhere (support, careers…)"],
    ["bookings", "bookings", { turn_outcome: "booking" }, "conversations that started the booking flow"],
    ["leads", "leads", () => $("leads").click(), "conversations where a lead was captured: opens the Leads view (every lead)"],
    ["handoffs", "handoffs", null, "conversations handed to a person"],
    ["feedback_up", "👍 rated up", { turn_outcome: "up" }, "answers visitors rated up"],
    ["feedback_down", "👎 rated down", { turn_outcome: "down" }, "answers visitors rated down"],
    ["resolution_rate", "resolution rate", null, "(resolved + converted) / conversations", percent],
    ["conversion_rate", "conversion rate", null, "converted / conversations", percent],
    ["ttft_ms_p50", "first token p50", null, "time to the answer's first token, median", ms],
    ["ttft_ms_p95", "first token p95", null, "time to the answer's first token, 95th percentile", ms],
  ];
  const OUTCOMES = [
    ["resolved", "answered or redirected, never rated down"], ["unresolved", "rated down, or its last answer found nothing"],
    ["converted", "a lead captured or a booking completed"], ["abandoned", "a booking left unfinished, or no reply"]];
  const MORE = [["blocked", "blocked", { turn_outcome: "blocked" }, "turns refused by the abuse gate"],
                ["failed", "failed", { turn_outcome: "failed" }, "turns that failed"],
                ["weak", "weak answers", null, "answers whose citations the audit flagged"]];

  function figure(key, label, behind, definition, value, format = String) {
    const box = el(behind ? "button" : "div", null, "figure");
    box.dataset.figure = key; box.title = definition;
    box.append(el("span", format(value), "value"), " ", el("span", label, "name"));
    if (behind) {
      box.classList.toggle("selected", key === listed?.key);
      box.type = "button";
      box.disabled = !value;
      box.addEventListener("click", () => typeof behind === "function" ? behind() : listConversations({ key, filter: behind, label }));
    }
    return box;
  }

  function showFigures(body) {
    const grid = (items) => { const box = el("div", null, "figures"); box.append(...items); return box; };
    const headline = HEADLINE.map(([key, label, behind, definition, format]) => figure(key, label, behind, definition, body[key], format));
    const outcomes = OUTCOMES.map(([name, definition]) => figure(name, name, { outcome: name }, definition, body.outcomes[name]));
    const more = MORE.map(([key, label, behind, definition]) => figure(key, label, behind, definition, body[key]));
    const spoken = Object.entries(body.languages).map(([code, n]) => `${code} ${n}`).join(" · ");
    $("insightFigures").replaceChildren(el("h3", "Headline"), grid(headline), el("h3", "Conversations by outcome"), grid(outcomes));
    $("insightTurns").replaceChildren(el("h3", "Turns"), grid(more), el("div", `${body.turns} turns · languages: ${spoken || "–"}`, "muted"));
  }

  // --- charts: bars drawn as SVG by `barChart` (no library: the page works offline) ---------------

  const SVG = "http://www.w3.org/2000/svg";
  function shape(tag, attributes, tooltip) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    if (tooltip) { const title = document.createElementNS(SVG, "title"); title.textContent = tooltip; node.append(title); }
    return node;
  }
  // One group of bars per day (a bar per series, side by side), scaled to the largest value
  // (or `max`); a day without a value has no bar. Each bar's tooltip is its day and value; the
  // labels are HTML under it, so the drawing stretches to the section's width.
  function barChart(title, days, series, { max, format = String } = {}) {
    const box = el("figure", null, "chart");
    const caption = el("figcaption");
    caption.append(el("h3", title));
    if (series.length > 1) for (const s of series) {
      const swatch = el("span", null, "swatch"); swatch.style.background = s.color;
      caption.append(swatch, el("span", s.label, "muted"));
    }
    const values = days.flatMap((day) => series.map((s) => s.value(day))).filter((v) => v !== null && v !== undefined);
    const top = max ?? Math.max(1, ...values);
    const slot = 10, width = days.length * slot, height = 100, bar = (slot - 2) / series.length;
    const said = days.flatMap((day) => series.map((s) => [day, s, s.value(day)])).filter(([, , v]) => v)
      .map(([day, s, v]) => `${day.day}${series.length > 1 ? " " + s.label : ""} ${format(v)}`);
    const drawing = shape("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img",
                                   "aria-label": `${title}: ${said.join(", ") || "none"}` });
    days.forEach((day, i) => series.forEach((s, j) => {
      const value = s.value(day);
      if (!value) return;
      const h = Math.max(1, height * value / top);
      drawing.append(shape("rect", { x: i * slot + 1 + j * bar, y: height - h, width: bar, height: h, fill: s.color,
                                     "data-day": day.day }, `${day.day}${series.length > 1 ? " · " + s.label : ""}: ${format(value)}`));
    }));
    const axis = el("div", null, "axis muted");
    axis.append(el("span", days[0]?.day || ""), el("span", `max ${format(top)}`), el("span", days[days.length - 1]?.day || ""));
    box.append(caption, drawing, axis);
    return box;
  }

  // Every UTC day of the range (the API's days are UTC, and only those with a conversation).
  function everyDay(body) {
    const known = Object.fromEntries(body.days.map((d) => [d.day, d]));
    const end = (body.until ?? Date.now() / 1000) * 1000, out = [];
    for (let t = Math.floor(body.since * 1000 / 864e5) * 864e5; t < end && out.length < 400; t += 864e5) {
      const day = new Date(t).toISOString().slice(0, 10);
      out.push(known[day] || { day });
    }
    return out;
  }

  function showCharts(body) {
    const days = everyDay(body);
    $("insightCharts").replaceChildren(
      barChart("Conversations per day", days, [{ label: "conversations", color: "#2f6fdb", value: (d) => d.conversations }]),
      barChart("Resolution rate per day", days, [{ label: "resolved", color: "#2e9d57", value: (d) => d.resolution_rate }],
               { max: 1, format: percent }),
      barChart("Leads per day", days, [{ label: "leads", color: "#8a4fd8", value: (d) => d.leads }]),
      barChart("Feedback per day", days, [{ label: "👍 up", color: "#2e9d57", value: (d) => d.feedback_up },
                                          { label: "👎 down", color: "#d0453b", value: (d) => d.feedback_down }]));
  }

  // --- the gaps ---------------------------------------------------------------------------------

  const GAP_STATUS = { open: "tag bad", answered: "tag", closed: "tag good" };
  const safeLink = (href, text) => {
    if (!/^https?:\/\//i.test(href || "")) return el("span", text || href);
    const link = el("a", text || href); link.href = href; link.target = "_blank"; link.rel = "noopener noreferrer";
    return link;
  };
  function sessionButton(session, text) {
    const open = el("button", text || (session.length > 12 ? session.slice(0, 12) + "…" : session));
    open.type = "button"; open.title = `open conversation ${session}`;
    open.addEventListener("click", () => openTimeline(session));
    return open;
  }

  function gapCard(gap) {
    const card = el("article", null, "gap"); card.dataset.gap = gap.id;
    const title = el("h3"); title.append(el("span", gap.status, GAP_STATUS[gap.status] || "tag"), " ", gap.suggested_page.title);
    card.append(title);
    const reasons = el("div", `${gap.size} visitor${gap.size === 1 ? "" : "s"} · asked ${gap.questions} time${gap.questions === 1 ? "" : "s"} · last ${when(gap.last_asked)} `, "muted");
    for (const [reason, n] of Object.entries(gap.reasons)) reasons.append(el("span", `${reason} ×${n}`, "tag"));
    card.append(reasons, el("div", "Asked as:", "muted"));
    const examples = el("ul", null, "examples");
    for (const example of gap.examples) examples.append(el("li", example));
    card.append(examples);
    if (gap.closest.length) {
      const closest = el("div", "Closest sections: ", "muted");
      gap.closest.forEach((s, i) => closest.append(i ? " · " : "", safeLink(s.url, s.title || s.url)));
      card.append(closest);
    }
    const page = el("div", "Suggested page: ", "muted");
    page.append(el("b", gap.suggested_page.title), " about ");
    for (const word of gap.suggested_page.about) page.append(el("span", word, "tag"));
    card.append(page);
    if (gap.curated) card.append(el("div", `Answered by the curated answer to “${gap.curated.question}”` +
      (gap.status === "answered" ? ": it closes once a visitor's question is answered from it." : "."), "muted"));
    if (gap.closed_by) {
      const closed = el("div", `Closed: “${gap.closed_by.question}” was answered from it (turn ${gap.closed_by.turn}, ${when(gap.closed_by.ts)}) `, "muted");
      closed.append(sessionButton(gap.closed_by.session_id, "Open that conversation"));
      card.append(closed);
    }
    const actions = el("div", "Conversations: ", "muted");
    for (const session of gap.sessions.slice(0, 8)) actions.append(sessionButton(session), " ");
    if (gap.sessions.length > 8) actions.append(`and ${gap.sessions.length - 8} more `);
    const write = el("button", "Write the answer"); write.type = "button"; write.className = "write";
    write.addEventListener("click", () => openAnswer(card, gap.suggested_page.title));
    card.append(actions, write);
    return card;
  }

  function showGaps(gaps) {
    if (form.closest("#insightGaps")) park();
    $("gapsCount").textContent = gaps.length ? `${gaps.length}` : "";
    $("insightGaps").replaceChildren(...gaps.map(gapCard));
    if (!gaps.length) $("insightGaps").append(el("div", "No gaps in this range: every question was answered.", "muted"));
  }

  // --- loading ----------------------------------------------------------------------------------

  let loading = 0;  // the latest load: an earlier one answering late is dropped
  async function loadInsight() {
    const { query, errors } = filters();
    showFieldErrors($("insightFilters"), errors, $("insightErrors"));
    if (errors.length) return;
    const mine = ++loading;
    $("insightWhich").textContent = site();
    status("loading insight…");
    const answer = await call("GET", `insight?${new URLSearchParams(query)}`);
    if (mine !== loading) return;
    if (answer.status !== 200) {
      if (answer.status === 422) showFieldErrors($("insightFilters"), fieldErrors(answer), $("insightErrors"));
      else $("insightErrors").textContent = problem(answer);
      status("insight not loaded", true);
      return;
    }
    const body = answer.body;
    for (const code of Object.keys(body.languages)) languages.add(code);
    const language = $("insightLanguage");
    const chosen = language.value;
    language.replaceChildren(el("option", "any"), ...[...languages].sort().map((code) => el("option", code)));
    language.firstChild.value = "";
    language.value = chosen;
    showFigures(body);
    showCharts(body);
    showGaps(body.gaps);
    status(`${body.conversations} conversations · ${body.gaps.length} gaps`);
    if (listed) listConversations(listed);  // the list shown, under the new filters
  }

  // The conversations behind a figure, each opening its timeline, each question answerable.
  let listed = null;  // {key, filter, label}: the figure whose conversations are listed
  async function listConversations(figure) {
    const { query } = filters();
    listed = figure;
    for (const box of view.querySelectorAll("[data-figure]")) box.classList.toggle("selected", box.dataset.figure === figure.key);
    $("behindWhich").textContent = figure.label;
    const list = $("insightConversations");
    if (form.closest("#insightConversations")) park();
    list.replaceChildren(el("div", "loading…", "muted"));
    const answer = await call("GET", `insight/conversations?${new URLSearchParams({ ...query, ...figure.filter })}`);
    if (listed !== figure) return;  // another figure was clicked meanwhile
    if (answer.status !== 200) { list.replaceChildren(el("div", problem(answer), "error")); return; }
    const rows = answer.body.conversations.map((c) => {
      const row = el("div", null, "row"); row.dataset.session = c.session_id;
      row.append(el("div", c.question || "(no message)"));
      const meta = el("div", `${when(c.started)} · ${c.language} · ${c.turns} turn${c.turns === 1 ? "" : "s"} `, "muted");
      meta.append(el("span", c.outcome, c.outcome === "unresolved" || c.outcome === "abandoned" ? "tag bad" : "tag good"));
      row.append(meta);
      row.addEventListener("click", (e) => { if (!e.target.closest("button, form")) openTimeline(c.session_id); });
      const open = sessionButton(c.session_id, "Open conversation");
      const write = el("button", "Write the answer"); write.type = "button"; write.className = "write";
      write.addEventListener("click", () => openAnswer(row, c.question));
      row.append(open, " ", write);
      return row;
    });
    list.replaceChildren(el("div", `${answer.body.count} conversation${answer.body.count === 1 ? "" : "s"}` +
      (answer.body.count > rows.length ? `, the newest ${rows.length} listed` : ""), "muted"), ...rows);
  }

  async function openTimeline(session) {
    for (const main of document.querySelectorAll("main")) main.hidden = main.id !== "conversationsView";
    await loadList();
    openConversation(site(), session, document.querySelector(`#list .row[data-session="${CSS.escape(session)}"]`));
  }

  // --- a curated answer: one form, opened under the gap or conversation it answers ---------------

  const form = $("answerForm"), question = $("answerQuestion"), text = $("answerText");
  function openAnswer(host, asked) {
    showFieldErrors(form, [], $("answerErrors"));
    question.value = asked || "";
    text.value = "";
    host.append(form);
    form.hidden = false;
    text.focus();
  }
  // Closed, and kept out of the lists that are drawn again.
  function park() { form.hidden = true; view.append(form); }
  $("answerCancel").addEventListener("click", park);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const notice = form.closest("section").querySelector(".notice");
    notice.textContent = "";
    $("answerSave").disabled = true;
    try {
      const answer = await call("POST", "insight/answers", { question: question.value, answer: text.value });
      if (answer.status !== 202) {
        showFieldErrors(form, answer.status === 422 ? fieldErrors(answer) : [], $("answerErrors"));
        if (answer.status !== 422) $("answerErrors").textContent = problem(answer);
        return;
      }
      park();
      notice.textContent = `The answer to “${answer.body.question}” is being added to the knowledge base ` +
        `(source ${answer.body.source}, sync run ${answer.body.run}): answers cite it once it is synced.`;
      status("curated answer added");
      await loadInsight();
    } finally { $("answerSave").disabled = false; }
  });

  // --- exports: fetched with the token (a plain link cannot carry it), saved from a Blob ---------

  async function download(name, keep) {
    const { query, errors } = filters();
    if (errors.length) return;
    const chosen = Object.fromEntries(Object.entries(query).filter(([k]) => keep.includes(k)));
    const response = await adminFetch(url(`insight/${name}?${new URLSearchParams(chosen)}`), { headers: headers() });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      $("insightErrors").textContent = problem({ status: response.status, body });
      return;
    }
    const link = el("a");
    link.href = URL.createObjectURL(await response.blob());
    link.download = `${site()}-${name}`;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }
  $("exportConversations").addEventListener("click", () => download("conversations.csv", ["since", "until", "language", "route"]));
  $("exportLeads").addEventListener("click", () => download("leads.csv", ["since", "until"]));
})();
