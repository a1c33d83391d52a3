import { $, el, status, fieldErrors, problem, showFieldErrors, headerView, adminFetch, siteCall, sleep, until, when } from "./core.js";
import { currentConversation, loadList, openConversation } from "./conversations.js";

(() => {
  // `$`, `el`, `status`, `when`, `sleep`, `headerView`, `problem`, `fieldErrors`, `showFieldErrors`,
  // `loadList` and `openConversation` are the page's own (the first script).
  const view = headerView("inboxView", "inbox", "Inbox", () => { refresh(); listen(); });
  const site = () => $("site").value.trim();
  const NAME_KEY = "concierge-operator-name";
  const operator = () => $("inboxOperator").value.trim();
  $("inboxOperator").value = sessionStorage.getItem(NAME_KEY) || "";

  const call = siteCall;
  // A 422's fields, whichever name the error handler gave them (errors.py: `errors`, `detail`).

  // --- the list: read when the view opens, after each action, and soon after each frame of the
  // site's feed that concerns it; every FALLBACK_MS only while the feed is down ------------------

  const FALLBACK_MS = 30000;
  const SOON_MS = 150;  // frames that come together (a claim and a message) read the list once
  const BADGE = { waiting: "tag bad", held: "tag good" };
  const REASONS = { visitor_asked: "the visitor asked for a person", lead_score: "a qualified lead (interest score)",
                    not_found: "answers in a row found nothing", operator: "an operator took it over" };  // shared/events.py HandoffReason
  let timer = null, loading = 0;
  let selected = null;      // the session shown on the right
  let selectedRow = null;   // its row of the latest list (null: no longer waiting or held)

  async function refresh() {
    clearTimeout(timer);
    if (view.hidden) return;
    const mine = ++loading;
    $("inboxWhich").textContent = site();
    try {
      const answer = await call("GET", "handoffs");
      if (mine !== loading) return;  // an earlier read answering late
      if (answer.status === 200) {
        $("inboxErrors").textContent = "";
        showList(answer.body.handoffs);
      } else $("inboxErrors").textContent = problem(answer);
    } catch (error) {
      if (mine === loading) $("inboxErrors").textContent = error.message;
    } finally {
      if (mine === loading && !view.hidden && !(feed && feed.up)) timer = setTimeout(refresh, FALLBACK_MS);
    }
  }
  function soon() { clearTimeout(timer); timer = setTimeout(refresh, SOON_MS); }

  // --- the feed: GET handoffs/live (server-sent events; services/gateway/handoffs.py), read with
  // `fetch` since EventSource cannot send the token. Open while the view is shown; after a drop it
  // is tried again after a pause, from the last frame's id (Last-Event-ID), so nothing is missed.

  const RETRY_PAUSES_MS = [500, 1000, 2000, 5000, 10000];
  let feed = null;  // {site, controller, last (the last frame's id), tries, up}: null while hidden
  const watched = new Set();  // the sessions listed or seen handed off: their visitors' messages matter

  function listen() {
    if (feed && feed.site === site()) return;
    stopListening();
    watched.clear();
    const mine = feed = { site: site(), controller: new AbortController(), last: null, tries: 0, up: false };
    (async () => {
      while (feed === mine) {
        try {
          const headers = {};
          if (mine.last) headers["Last-Event-ID"] = mine.last;
          const response = await adminFetch(`/v1/admin/sites/${encodeURIComponent(mine.site)}/handoffs/live`,
                                       { headers, signal: mine.controller.signal });
          if (response.ok) await read(mine, response.body.getReader());
        } catch (error) { /* a drop or the abort: tried again below, or done */ }
        if (feed !== mine) return;
        mine.up = false;  // down (the view is shown: hiding it ends the feed): the slow poll meanwhile
        clearTimeout(timer); timer = setTimeout(refresh, FALLBACK_MS);
        await sleep(RETRY_PAUSES_MS[Math.min(mine.tries++, RETRY_PAUSES_MS.length - 1)]);
      }
    })();
  }
  function stopListening() {
    if (feed) feed.controller.abort();
    feed = null;
  }

  // Frames are blocks of `id:` and `data:` lines ended by a blank line; `:` lines keep it alive.
  async function read(mine, reader) {
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done || feed !== mine) return;
      buffer += decoder.decode(value, { stream: true });
      const blocks = buffer.split("\n\n");
      buffer = blocks.pop();
      for (const block of blocks) {
        const lines = block.split("\n");
        const id = lines.find((l) => l.startsWith("id:")), data = lines.find((l) => l.startsWith("data:"));
        if (data) take(mine, id && id.slice(3).trim(), JSON.parse(data.slice(5)));
      }
    }
  }

  function take(mine, id, frame) {
    if (id) mine.last = id;
    mine.tries = 0;
    if (frame.type === "ready") { mine.up = true; soon(); return; }  // (again) live: the list as it is now
    if (frame.type !== "turn_requested") watched.add(frame.session_id);
    if (watched.has(frame.session_id)) soon();
  }
  // Hidden by another view's button or the timeline: the feed closes with it.
  new MutationObserver(() => {
    if (view.hidden) { stopListening(); clearTimeout(timer); }
  }).observe(view, { attributes: true, attributeFilter: ["hidden"] });

  const known = (value) => value && value !== "unknown" ? value : "";
  function visitor(profile) {
    return [known(profile.company_name), known(profile.email)].filter(Boolean).join(" · ");
  }
  function summary(h) {
    const line = el("div", null, "muted");
    line.append(el("span", h.status, BADGE[h.status] || "tag"), ` ${REASONS[h.reason] || h.reason} · since ${when(h.requested_ts)}`);
    if (h.operator) line.append(` · held by `, el("b", h.operator));
    if (visitor(h.visitor_profile)) line.append(` · ${visitor(h.visitor_profile)}`);
    line.append(" ", el("span", `interest ${h.interest_score}`, "tag"));
    return line;
  }

  // Each row is a button to the keyboard too (Tab reaches it, Enter or Space opens it); a
  // refresh that draws the list again gives the focus back to the row that had it.
  function showList(handoffs) {
    for (const h of handoffs) watched.add(h.session_id);
    selectedRow = handoffs.find((h) => h.session_id === selected) || null;
    const focused = document.activeElement && document.activeElement.closest("#inboxList .row");
    const rows = handoffs.map((h) => {
      const row = el("div", null, "row"); row.dataset.session = h.session_id;
      row.tabIndex = 0; row.setAttribute("role", "button");
      row.classList.toggle("selected", h.session_id === selected);
      row.setAttribute("aria-pressed", String(h.session_id === selected));
      const asked = h.messages.filter((m) => m.role === "user").pop();
      row.append(el("div", asked ? asked.content : h.session_id), summary(h));
      row.addEventListener("click", () => select(h.session_id, h));
      row.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(h.session_id, h); }
      });
      return row;
    });
    $("inboxList").replaceChildren(...rows);
    const again = focused && rows.find((r) => r.dataset.session === focused.dataset.session);
    if (again) again.focus();
    if (!rows.length) $("inboxList").append(el("div", "Nobody is waiting for a person.", "muted"));
    if (selected) showConversation();
  }

  // --- one conversation: its last messages (the list's) and what the operator can do -------------

  const WHO = { user: "Visitor", assistant: "AI", notice: "Nobody available" };
  let shown = "";  // the transcript drawn, as JSON: drawn again only when it changed
  function select(session, row) {
    if (session !== selected) { showFieldErrors(view, [], $("handoffErrors")); shown = ""; }
    selected = session; selectedRow = row;
    for (const item of $("inboxList").querySelectorAll(".row")) {
      item.classList.toggle("selected", item.dataset.session === session);
      item.setAttribute("aria-pressed", String(item.dataset.session === session));
    }
    showConversation();
  }

  function showConversation() {
    const h = selectedRow;
    $("handoffWhich").textContent = selected;
    $("handoffActions").hidden = false;
    if (!h) {  // nobody asked for a person (or it ended): an operator may still join
      $("handoffMeta").replaceChildren(el("div", "No handoff is waiting or held in this conversation: join it to "
                                                 + "write to the visitor (the AI stops answering it).", "muted"));
      $("handoffTranscript").replaceChildren(); shown = "";
      for (const id of ["handoffRelease", "handoffClose"]) $(id).hidden = true;
      $("handoffClaim").hidden = false; $("handoffClaim").textContent = "Join";
      $("handoffReply").hidden = true;
      return;
    }
    $("handoffClaim").textContent = "Claim";
    $("handoffMeta").replaceChildren(summary(h));
    if ((h.sources || []).length) {  // what retrieval found for the latest question: pages to point to
      const found = el("div", "Found for the latest question: ", "muted");
      h.sources.forEach((source, i) => {
        const link = el("a", source.title || source.url);
        if (/^https?:\/\//.test(source.url)) { link.href = source.url; link.target = "_blank"; link.rel = "noopener"; }
        found.append(i ? " · " : "", link);
      });
      $("handoffMeta").append(found);
    }
    const drawn = JSON.stringify(h.messages);
    if (drawn !== shown) {
      shown = drawn;
      $("handoffTranscript").replaceChildren(...h.messages.map((m) => {
        const box = el("div", null, `msg ${m.role}`);
        box.append(el("span", m.role === "operator" ? `${m.operator} (operator)` : WHO[m.role] || m.role, "who"), m.content);
        return box;
      }));
    }
    const mine = h.status === "held" && h.operator === operator();
    $("handoffClaim").hidden = mine;
    $("handoffRelease").hidden = $("handoffClose").hidden = false;
    $("handoffReply").hidden = !mine;
  }

  // An action on the selected conversation: its problems shown (a 422 beside its field, a 409
  // naming the holder), then the list read again.
  async function act(path, body, done) {
    showFieldErrors(view, [], $("handoffErrors"));
    sessionStorage.setItem(NAME_KEY, operator());
    const session = selected;
    try {
      const answer = await call("POST", `handoffs/${encodeURIComponent(session)}/${path}`, body);
      if (answer.status === 200 || answer.status === 201) done(answer.body);
      else if (answer.status === 422) showFieldErrors(view, fieldErrors(answer), $("handoffErrors"));
      else if (answer.status === 409 && answer.body.holder) $("handoffErrors").textContent = `${answer.body.holder} holds this conversation`;
      else $("handoffErrors").textContent = problem(answer);
    } catch (error) { $("handoffErrors").textContent = error.message; }
    await refresh();
  }

  // Who acts: the name typed, or none (a named operator's own key names them: routes/handoffs.py).
  const who = (more = {}) => (operator() ? { operator: operator(), ...more } : more);
  $("handoffClaim").addEventListener("click", () =>
    act("claim", who(), (body) => {
      if (!operator() && body.operator) { $("inboxOperator").value = body.operator; sessionStorage.setItem(NAME_KEY, body.operator); }
      status(`you hold ${selected}: the AI no longer answers it`);
    }));
  // A reply keeps its id until it is stored: sent again after a failed answer, it is stored once.
  let replyId = null;
  $("handoffText").addEventListener("input", () => { replyId = null; });
  $("handoffReply").addEventListener("submit", (e) => {
    e.preventDefault();
    replyId = replyId || (crypto.randomUUID ? crypto.randomUUID()  // a secure context's; else one of its own
                                            : Date.now().toString(36) + "-" + Math.random().toString(36).slice(2));
    act("messages", who({ text: $("handoffText").value, client_message_id: replyId }),
        () => { $("handoffText").value = ""; replyId = null; status("reply sent"); });
  });
  $("handoffRelease").addEventListener("click", () =>
    act("release", who(), () => status(`${selected} handed back to the AI`)));
  $("handoffClose").addEventListener("click", () =>
    act("close", who(), () => status(`${selected} closed`)));
  // The Conversations view's "Join in the Inbox": this view, that conversation selected.
  $("join").addEventListener("click", () => {
    const current = currentConversation();
    if (!current) return;
    $("inbox").click();
    select(current.session, null);
  });
  $("handoffTimeline").addEventListener("click", async () => {
    const session = selected;
    for (const main of document.querySelectorAll("main")) main.hidden = main.id !== "conversationsView";
    await loadList();
    openConversation(site(), session, document.querySelector(`#list .row[data-session="${CSS.escape(session)}"]`));
  });
  $("inboxOperator").addEventListener("input", () => {
    sessionStorage.setItem(NAME_KEY, operator());
    if (selected) showConversation();
  });
  $("site").addEventListener("change", () => {
    if (view.hidden) return;
    selected = selectedRow = null; shown = "";
    $("handoffWhich").textContent = ""; $("handoffMeta").replaceChildren(el("div", "Select a conversation.", "muted"));
    $("handoffTranscript").replaceChildren(); $("handoffActions").hidden = true; $("handoffReply").hidden = true;
    refresh(); listen();
  });
})();
