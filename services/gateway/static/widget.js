/* Concierge chat widget: one script a site embeds.
 *
 *   <script src="https://concierge.example/widget.js" data-site="demo"></script>
 *
 * data-site (required): the site id. data-api (optional): the gateway's URL (default: where
 * this script came from). The widget's look (colours, title, greeting, launcher text, side,
 * logo, starter questions, whether sources are listed) is the site's, read from
 * GET /v1/sites/{site}/widget when the script loads: a site changes it in its config, not in
 * its pages. data-settings (optional, JSON): settings that take precedence over the site's
 * (the operator UI's preview of unsaved edits); data-open: start with the panel open.
 * window.ConciergeIdentity (optional; an object, or a function returning one, set by the
 * site's page): who the visitor is as far as the site knows (reveal, session_uuid, person_id,
 * email_hash), sent with each message (docs/examples/identity.html).
 * The session id and its token (the conversation's only key: the
 * gateway refuses a session id without it) are kept in localStorage per site, so a reload
 * resumes the conversation; an answer cut off (a reload, a dropped connection) is resumed
 * from the turn's stream after the last frame read, and a message whose sending failed before
 * its turn began streaming is sent again with the same id (the gateway then streams the turn
 * that try started, if it did, instead of starting another). The page's origin must be in the
 * site's `allowed_origins`.
 * Under each answer (route ANSWER) a thumbs up and a thumbs down post the visitor's vote
 * (POST /v1/sites/{site}/conversations/{session}/turns/{turn}/feedback, the session's token);
 * a thumbs-down then offers a one-line reason. The turn's latest vote counts, so a vote can
 * be changed; after a reload the conversation's view says which vote is stored (pressed again).
 * A person of the site's team (a handoff, route HANDOFF): once a turn ends with that route, or
 * a reloaded conversation's view says the handoff is waiting or held, the widget listens on
 * the conversation's live channel (GET /v1/sites/{site}/conversations/{session}/live, the
 * session's token; read with fetch, since an EventSource cannot send the token) until the
 * handoff ends, from after the last frame it read (kept per session: a dropped connection or
 * a reload resumes it). A status line under the header says where the handoff stands
 * (aria-live); the operator's arrival and departure are lines in the log, their messages
 * bubbles with their name (no vote under them). The visitor keeps writing as before: those
 * turns end with no answer, and show none.
 * No dependencies, no CDN.
 */
(function () {
  "use strict";
  var script = document.currentScript;
  var site = script.getAttribute("data-site");
  var api = (script.getAttribute("data-api") || new URL(script.src).origin).replace(/\/$/, "");
  var storeKey = "concierge:" + site + ":session";
  var tokenKey = "concierge:" + site + ":token";
  var streamKey = "concierge:" + site + ":stream";
  var liveKey = "concierge:" + site + ":live";
  // A try that failed in transit is tried again after each of these pauses: every second at
  // first (a load balancer sends the next try to a live gateway), 30 s in all (long enough for
  // a lone gateway to come back). cli/harness/visitor.py, the rehearsals' visitor, does the same.
  var RETRY_PAUSES_MS = [1000, 1000, 1000, 2000, 2000, 3000, 5000, 5000, 10000];
  if (!site) { console.error("concierge widget: data-site is required"); return; }

  // The colours are custom properties on the widget's own two boxes (the launcher and the
  // panel), so the site's settings restyle the widget and nothing else of the page.
  var css = [
    ".cw-launch,.cw-panel{--cw-primary:#0b5cad;--cw-bg:#fff;--cw-text:#1b1f24}",
    ".cw-launch{position:fixed;right:24px;bottom:24px;border:0;border-radius:28px;padding:14px 20px;background:var(--cw-primary);color:#fff;font:600 15px system-ui;cursor:pointer;box-shadow:0 4px 14px #0003;z-index:2147483000}",
    ".cw-panel{position:fixed;right:24px;bottom:88px;width:370px;max-width:calc(100vw - 32px);height:560px;max-height:calc(100vh - 120px);display:none;flex-direction:column;background:var(--cw-bg);border-radius:14px;box-shadow:0 8px 30px #0004;font:14px/1.45 system-ui;color:var(--cw-text);z-index:2147483000;overflow:hidden}",
    ".cw-launch.cw-left,.cw-panel.cw-left{right:auto;left:24px}",
    ".cw-panel.cw-open{display:flex}",
    ".cw-head{display:flex;align-items:center;justify-content:space-between;gap:8px;padding:12px 14px;background:var(--cw-primary);color:#fff;font-weight:600}",
    ".cw-title{flex:1;display:flex;align-items:center;gap:8px}",
    ".cw-avatar{width:26px;height:26px;border-radius:50%;object-fit:cover;background:#fff}",
    ".cw-head button{background:transparent;border:1px solid #fff8;color:#fff;border-radius:6px;padding:3px 8px;cursor:pointer;font-size:12px}",
    ".cw-log{flex:1;overflow-y:auto;padding:12px;display:flex;flex-direction:column;gap:8px}",
    ".cw-msg{max-width:85%;padding:8px 11px;border-radius:12px;white-space:pre-wrap;word-wrap:break-word}",
    ".cw-user{align-self:flex-end;background:var(--cw-primary);color:#fff}",
    // The answer's bubble: a tint of the text colour over the background, so it stays readable on a dark one.
    ".cw-bot{align-self:flex-start;background:#f0f3f7;background:color-mix(in srgb,var(--cw-text) 7%,var(--cw-bg));color:var(--cw-text)}",
    ".cw-bot p{margin:0 0 6px}.cw-bot p:last-child{margin-bottom:0}",
    ".cw-bot ul,.cw-bot ol{margin:0 0 6px;padding-left:20px;white-space:normal}.cw-bot ul:last-child,.cw-bot ol:last-child{margin-bottom:0}",
    ".cw-bot li{white-space:pre-wrap}",
    ".cw-link{color:var(--cw-primary)}",
    ".cw-notice{align-self:center;background:#fff4e5;color:#7a4300;border:1px solid #f3c78a;font-size:13px}",
    ".cw-status{padding:6px 14px;font-size:12px;background:#fff4e5;color:#7a4300;border-bottom:1px solid #f3c78a}",
    ".cw-status:empty{display:none}",
    ".cw-event{align-self:center;font-size:12px;opacity:.75;text-align:center}",
    ".cw-operator-name{display:block;font-size:11px;font-weight:600;opacity:.75;margin-bottom:2px}",
    ".cw-error{align-self:center;background:#fde8e8;color:#8a1c1c;border:1px solid #f0a8a8;font-size:13px}",
    ".cw-sources{align-self:flex-start;font-size:12px;opacity:.8;max-width:85%}",
    ".cw-sources a{color:var(--cw-primary);margin-right:8px}",
    ".cw-cite{color:var(--cw-primary);font-size:11px;vertical-align:super;text-decoration:none}",
    ".cw-chips{display:flex;flex-wrap:wrap;gap:6px;align-self:flex-start}",
    ".cw-chips button,.cw-cta{border:1px solid var(--cw-primary);background:var(--cw-bg);color:var(--cw-primary);border-radius:14px;padding:5px 10px;cursor:pointer;font-size:13px;text-decoration:none}",
    ".cw-cta{background:var(--cw-primary);color:#fff;align-self:flex-start}",
    ".cw-form{display:flex;gap:6px;padding:10px;border-top:1px solid #e3e7ec}",
    ".cw-form input{flex:1;border:1px solid #c9d1da;border-radius:8px;padding:8px;background:#fff;color:#1b1f24}",
    ".cw-form button{border:0;background:var(--cw-primary);color:#fff;border-radius:8px;padding:8px 12px;cursor:pointer}",
    ".cw-form button:disabled{opacity:.5;cursor:default}",
    // The votes under an answer: quiet until hovered, focused or pressed (the site's colour).
    ".cw-vote{display:flex;align-items:center;gap:4px;align-self:flex-start;margin-top:-4px}",
    ".cw-vote button{display:inline-flex;align-items:center;justify-content:center;width:28px;height:24px;padding:0;border:1px solid transparent;border-radius:6px;background:transparent;color:var(--cw-text);opacity:.55;cursor:pointer}",
    ".cw-vote button:hover,.cw-vote button:focus-visible{opacity:1;border-color:var(--cw-primary)}",
    ".cw-vote button[aria-pressed=true]{opacity:1;background:var(--cw-primary);color:#fff}",
    ".cw-vote button:disabled{cursor:default}",
    ".cw-vote svg{width:15px;height:15px;fill:currentColor}",
    ".cw-vote-status{font-size:12px;opacity:.75;margin-left:4px}",
    ".cw-reason{display:flex;gap:6px;align-self:flex-start;width:85%}",
    ".cw-reason input{flex:1;min-width:0;border:1px solid #c9d1da;border-radius:8px;padding:5px 8px;font-size:13px;background:#fff;color:#1b1f24}",
    ".cw-reason button{border:0;background:var(--cw-primary);color:#fff;border-radius:8px;padding:5px 10px;cursor:pointer;font-size:13px}",
    ".cw-reason button:disabled{opacity:.5;cursor:default}"
  ].join("\n");
  var style = document.createElement("style");
  style.textContent = css;
  document.head.appendChild(style);

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = text;
    return node;
  }

  var launch = el("button", "cw-launch", "Chat with us");
  launch.setAttribute("data-testid", "cw-launch");
  var panel = el("div", "cw-panel");
  panel.setAttribute("role", "dialog");
  var head = el("div", "cw-head");
  var titleBox = el("span", "cw-title");
  var title = el("span", null, "Ask us anything");
  title.setAttribute("data-testid", "cw-title");
  titleBox.appendChild(title);
  head.appendChild(titleBox);
  var reset = el("button", null, "New conversation");
  reset.setAttribute("data-testid", "cw-new");
  head.appendChild(reset);
  // Where a handoff stands, announced to screen readers as it changes; hidden when empty.
  var handoffStatus = el("div", "cw-status");
  handoffStatus.setAttribute("role", "status");
  handoffStatus.setAttribute("aria-live", "polite");
  handoffStatus.setAttribute("data-testid", "cw-handoff-status");
  var log = el("div", "cw-log");
  log.setAttribute("data-testid", "cw-log");
  var form = el("form", "cw-form");
  var input = el("input");
  input.placeholder = "Type your question…";
  input.setAttribute("data-testid", "cw-input");
  input.maxLength = 15000;
  var send = el("button", null, "Send");
  send.type = "submit";
  form.appendChild(input);
  form.appendChild(send);
  panel.appendChild(head);
  panel.appendChild(handoffStatus);
  panel.appendChild(log);
  panel.appendChild(form);
  document.body.appendChild(panel);
  document.body.appendChild(launch);

  var busy = false;
  var settings = {show_sources: true, greeting: "", starter_questions: []};
  var starters = null;  // the starter questions' buttons while the conversation is new
  if (script.hasAttribute("data-open")) panel.classList.add("cw-open");
  launch.addEventListener("click", function () {
    panel.classList.toggle("cw-open");
    if (panel.classList.contains("cw-open")) input.focus();
  });
  reset.addEventListener("click", function () {
    localStorage.removeItem(storeKey);
    localStorage.removeItem(tokenKey);
    localStorage.removeItem(streamKey);
    localStorage.removeItem(liveKey);
    stopListening();
    handoff = "";
    handoffStatus.textContent = "";
    log.textContent = "";
    input.type = "text";
    input.placeholder = "Type your question…";
    welcome();
  });
  form.addEventListener("submit", function (e) {
    e.preventDefault();
    var text = input.value.trim();
    if (text && !busy) ask(text);
  });

  function scroll() { log.scrollTop = log.scrollHeight; }

  // --- the site's look (GET /v1/sites/{site}/widget, validated there; checked again here,
  // since data-settings comes from the page) ---
  var COLOR = /^#([0-9a-f]{3}|[0-9a-f]{6})$/i;
  var COLORS = {primary_color: "--cw-primary", background_color: "--cw-bg", text_color: "--cw-text"};

  function apply(given) {
    Object.keys(given || {}).forEach(function (k) { settings[k] = given[k]; });
    Object.keys(COLORS).forEach(function (k) {
      if (typeof settings[k] === "string" && COLOR.test(settings[k])) {
        launch.style.setProperty(COLORS[k], settings[k]);
        panel.style.setProperty(COLORS[k], settings[k]);
      }
    });
    if (settings.title) title.textContent = settings.title;
    if (settings.launcher_text) launch.textContent = settings.launcher_text;
    var left = settings.position === "left";
    launch.classList.toggle("cw-left", left);
    panel.classList.toggle("cw-left", left);
    var avatar = titleBox.querySelector(".cw-avatar"), src = https(settings.avatar_url);
    if (src && !avatar) {
      avatar = el("img", "cw-avatar");
      avatar.alt = "";
      avatar.setAttribute("data-testid", "cw-avatar");
      titleBox.insertBefore(avatar, title);
    }
    if (avatar && src) avatar.src = src;
    else if (avatar) avatar.remove();
  }

  function https(url) {
    try { return url && new URL(url).protocol === "https:" ? new URL(url).href : null; } catch (e) { return null; }
  }

  // A new conversation opens with the site's greeting and its starter questions.
  function welcome() {
    if (log.querySelector(".cw-user, [data-testid=cw-bot]")) return;
    log.textContent = "";
    if (settings.greeting) {
      var hello = el("div", "cw-msg cw-bot", settings.greeting);
      hello.setAttribute("data-testid", "cw-greeting");
      log.appendChild(hello);
    }
    var questions = (settings.starter_questions || []).filter(function (q) { return typeof q === "string" && q; });
    starters = null;
    if (questions.length) starters = chips(questions.slice(0, 6), "cw-starters");
  }

  function readSettings() {
    var preview = null;
    try { preview = JSON.parse(script.getAttribute("data-settings") || "null"); } catch (e) { preview = null; }
    return fetch(api + "/v1/sites/" + encodeURIComponent(site) + "/widget")
      .then(function (r) { return r.ok ? r.json() : null; })
      .catch(function () { return null; })  // unreachable: the defaults, and the chat says why when used
      .then(function (body) {
        apply(body && body.widget);
        if (preview) apply(preview);
      });
  }

  // The answer's markdown, a safe subset built with DOM calls only (never innerHTML, so no
  // HTML from a model is ever parsed): paragraphs, bullet and numbered lists, **bold**,
  // [label](url) links when the URL is http(s) (any other scheme stays plain text), and
  // "[2]" citations, which link to source 2. Re-run on every token while the answer streams.
  var INLINE = /\*\*(.+?)\*\*|__(.+?)__|\[([^\]\n]+)\]\(([^()\s]+)\)|\[(\d+)\]/;

  function safeUrl(url) {
    try {
      var u = new URL(url);
      return u.protocol === "https:" || u.protocol === "http:" ? u.href : null;
    } catch (e) { return null; }
  }

  function inline(parent, text, byN) {
    var re = new RegExp(INLINE.source, "g"), last = 0, m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      last = re.lastIndex;
      if (m[1] != null || m[2] != null) {
        var strong = el("strong");
        inline(strong, m[1] != null ? m[1] : m[2], byN);
        parent.appendChild(strong);
      } else if (m[3] != null) {
        var href = safeUrl(m[4]);
        if (href) {
          var link = el("a", "cw-link", m[3]);
          link.href = href; link.target = "_blank"; link.rel = "noopener nofollow";
          parent.appendChild(link);
        } else {
          parent.appendChild(document.createTextNode(m[3]));
        }
      } else if (byN[m[5]]) {
        // A source's URL is the site's data (a PDF's /Title, a text source's title): only an
        // http(s) one becomes a link, as in the sources box; any other cites as plain text.
        var cite = safeUrl(byN[m[5]].url);
        var a = el(cite ? "a" : "span", "cw-cite", "[" + m[5] + "]");
        if (cite) { a.href = cite; a.target = "_blank"; a.rel = "noopener"; }
        a.title = byN[m[5]].title || "";
        parent.appendChild(a);
      } else {
        parent.appendChild(document.createTextNode(m[0]));
      }
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function renderAnswer(node, text, sources) {
    var byN = {};
    (sources || []).forEach(function (s) { byN[s.n] = s; });
    node.textContent = "";
    var para = [], list = null, item = null;
    function endParagraph() {
      if (!para.length) return;
      var p = el("p");
      inline(p, para.join("\n"), byN);
      node.appendChild(p);
      para = [];
    }
    text.replace(/\r\n?/g, "\n").split("\n").forEach(function (line) {
      var bullet = /^\s*[-*\u2022]\s+(.*)$/.exec(line), numbered = /^\s*\d+[.)]\s+(.*)$/.exec(line);
      var tag = bullet ? "UL" : numbered ? "OL" : null;
      if (tag) {
        endParagraph();
        if (!list || list.tagName !== tag) { list = el(tag.toLowerCase()); node.appendChild(list); }
        item = el("li");
        inline(item, (bullet || numbered)[1], byN);
        list.appendChild(item);
      } else if (!line.trim()) {
        endParagraph();
        list = item = null;
      } else if (item && /^\s+\S/.test(line)) {  // an indented line continues the list item
        inline(item, "\n" + line.trim(), byN);
      } else {
        list = item = null;
        para.push(line);
      }
    });
    endParagraph();
  }

  // One link per source page, with the numbers that point to it: "Integrations [1][3]".
  // The sources the answer cited (the server marks them), else all it was given; a source
  // without a page (a knowledge-graph entity) has nothing to link to.
  function showSources(sources) {
    if (!settings.show_sources || !sources || !sources.length) return;
    var cited = sources.filter(function (s) { return s.cited; });
    var shown = (cited.length ? cited : sources).filter(function (s) { return /^https?:\/\//.test(s.url || ""); });
    if (!shown.length) return;
    var pages = [], byUrl = {};
    shown.forEach(function (s) {
      var page = byUrl[s.url];
      if (!page) {
        page = byUrl[s.url] = {url: s.url, label: null, numbers: []};
        pages.push(page);
      }
      if (!page.label && s.document_type === "chunk") page.label = s.title.split(" — ")[0];
      page.numbers.push(s.n);
    });
    var box = el("div", "cw-sources");
    box.setAttribute("data-testid", "cw-sources");
    box.appendChild(document.createTextNode("Sources: "));
    pages.slice(0, 5).forEach(function (page) {
      var a = el("a", null, (page.label || page.url) + " " + page.numbers.slice(0, 4).map(function (n) {
        return "[" + n + "]";
      }).join(""));
      a.href = page.url; a.target = "_blank"; a.rel = "noopener";
      box.appendChild(a);
    });
    log.appendChild(box);
  }

  function chips(items, testid) {
    if (!items || !items.length) return;
    var box = el("div", "cw-chips");
    box.setAttribute("data-testid", testid);
    items.forEach(function (text) {
      var b = el("button", null, text);
      b.type = "button";
      b.addEventListener("click", function () { if (!busy) ask(text); });
      box.appendChild(b);
    });
    log.appendChild(box);
    return box;
  }

  function finish(meta) {
    meta = meta || {};
    showSources(meta.sources);
    chips(meta.suggested_follow_ups, "cw-follow-ups");
    chips(meta.suggested_answers, "cw-answers");
    var booking = (meta.cta_url_overrides || {}).booking_url || (meta.cta && meta.cta.url);
    if (booking && (meta.route === "BOOKING" || (meta.skill_selection_state || {}).applied &&
        meta.skill_selection_state.applied.indexOf("propose_demo") >= 0)) {
      var cta = el("a", "cw-cta", (meta.cta && meta.cta.label) || "Book a demo");
      cta.href = booking; cta.target = "_blank"; cta.rel = "noopener";
      cta.setAttribute("data-testid", "cw-cta");
      log.appendChild(cta);
    }
    var wantsEmail = meta.booking && meta.booking.active && meta.booking.pending_field === "email";
    input.type = wantsEmail ? "email" : "text";
    input.placeholder = wantsEmail ? "Your work e-mail" : "Type your question…";
  }

  // --- votes on an answer: thumbs up or down (aria-pressed shows the one stored), and after a
  // thumbs-down an optional reason, sent as the same vote with its reason (the latest counts).
  var THUMB = "M2 10h4v11H2zM8 10l4.5-7.5c1.3 0 2.2 1 2 2.3L14 9h5.5c1.4 0 2.4 1.3 2 2.6l-2 7.4c-.3 1.2-1.3 2-2.5 2H8z";
  var REASON_CHARS = 500;  // the gateway's limit (shared/events.py FEEDBACK_REASON_CHARS)

  function thumb(down) {
    var ns = "http://www.w3.org/2000/svg";
    var svg = document.createElementNS(ns, "svg"), path = document.createElementNS(ns, "path");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    path.setAttribute("d", THUMB);
    if (down) path.setAttribute("transform", "matrix(1 0 0 -1 0 24)");  // the same hand, upside down
    svg.appendChild(path);
    return svg;
  }

  function voteButton(rating, label) {
    var b = el("button");
    b.type = "button";
    b.title = label;
    b.setAttribute("aria-label", label);
    b.setAttribute("aria-pressed", "false");
    b.setAttribute("data-testid", "cw-vote-" + rating);
    b.appendChild(thumb(rating === "down"));
    return b;
  }

  // The vote on `turn` of the conversation `session` (the one the answer is in), with its token.
  function sendVote(session, turn, body) {
    return fetch(api + "/v1/sites/" + encodeURIComponent(site) + "/conversations/" + encodeURIComponent(session) +
                 "/turns/" + turn + "/feedback", {
      method: "POST",
      headers: {"content-type": "application/json", "X-Session-Token": localStorage.getItem(tokenKey) || ""},
      body: JSON.stringify(body)
    }).then(function (resp) {
      if (!resp.ok) {
        throw new Error(resp.status === 429 ? "Too many votes; please try again in a minute."
                                            : "Your vote could not be saved.");
      }
    });
  }

  // The thumbs under the answer of `turn`, placed where the log ends now (just after the answer);
  // `stored`: the vote the log holds for it ("up", "down"; none: "").
  function votes(turn, stored) {
    var session = localStorage.getItem(storeKey);
    if (!turn || !session) return;
    var box = el("div", "cw-vote");
    box.setAttribute("role", "group");
    box.setAttribute("aria-label", "Was this answer helpful?");
    box.setAttribute("data-testid", "cw-vote");
    var up = voteButton("up", "Helpful"), down = voteButton("down", "Not helpful");
    var status = el("span", "cw-vote-status");
    status.setAttribute("role", "status");
    status.setAttribute("data-testid", "cw-vote-status");
    box.appendChild(up); box.appendChild(down); box.appendChild(status);
    log.appendChild(box);
    var chosen = null, reason = null;

    function show(rating) {
      chosen = rating;
      up.setAttribute("aria-pressed", String(rating === "up"));
      down.setAttribute("aria-pressed", String(rating === "down"));
    }
    if (stored === "up" || stored === "down") show(stored);

    // Shown pressed at once; put back as it was when the gateway refuses it. True once stored.
    function cast(body) {
      var before = chosen;
      show(body.rating);
      up.disabled = down.disabled = true;
      status.textContent = "";
      return sendVote(session, turn, body).then(function () {
        status.textContent = "Thanks for your feedback.";
        return true;
      }, function (err) {
        show(before);
        status.textContent = err.message;
        return false;
      }).then(function (stored) {
        up.disabled = down.disabled = false;
        return stored;
      });
    }

    function askReason() {
      reason = el("form", "cw-reason");
      var text = el("input");
      text.maxLength = REASON_CHARS;
      text.placeholder = "What was wrong? (optional)";
      text.setAttribute("aria-label", "What was wrong with this answer? (optional)");
      text.setAttribute("data-testid", "cw-reason");
      var sendReason = el("button", null, "Send");
      sendReason.type = "submit";
      sendReason.setAttribute("data-testid", "cw-reason-send");
      reason.appendChild(text);
      reason.appendChild(sendReason);
      reason.addEventListener("submit", function (e) {
        e.preventDefault();
        var said = text.value.trim();
        if (!said) return;
        sendReason.disabled = true;
        cast({rating: "down", reason: said}).then(function (stored) {
          if (stored && reason) { reason.remove(); reason = null; }
          else sendReason.disabled = false;
        });
      });
      log.insertBefore(reason, box.nextSibling);
      text.focus();
    }

    up.addEventListener("click", function () {
      if (chosen === "up") return;
      if (reason) { reason.remove(); reason = null; }
      cast({rating: "up"});
    });
    down.addEventListener("click", function () {
      if (chosen === "down") return;
      cast({rating: "down"}).then(function (stored) { if (stored && !reason && chosen === "down") askReason(); });
    });
  }

  // The answer streaming now: its turn and the id of the last frame read (`<turn>:<n>`), kept
  // while it streams so that a dropped connection or a reload resumes it instead of losing it.
  function remember(turn) {
    localStorage.setItem(streamKey, JSON.stringify({turn: turn.number, last: turn.last}));
  }

  function bubble() {
    var bot = el("div", "cw-msg cw-bot", "…");
    bot.setAttribute("data-testid", "cw-bot");
    log.appendChild(bot);
    scroll();
    return {bot: bot, answer: "", sources: [], started: false, number: null, last: null,
            text: null, id: null, tries: 0};
  }

  // The message's id, the same each time it is sent again.
  function messageId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return Date.now().toString(36) + "-" + Math.random().toString(36).slice(2, 12);
  }

  // A server-sent event's id and data (parsed); null for a keepalive comment.
  function parseFrame(block) {
    var id = null, data = null;
    block.split("\n").forEach(function (l) {
      if (l.indexOf("id: ") === 0) id = l.slice(4);
      else if (l.indexOf("data: ") === 0) data = l.slice(6);
    });
    return data === null ? null : {id: id, event: JSON.parse(data)};
  }

  // One frame into the bubble; true once the turn ended (complete or error).
  function take(turn, block) {
    var frame = parseFrame(block);
    if (!frame) return false;
    var event = frame.event;
    if (frame.id) turn.last = frame.id;
    if (event.type === "start") {
      turn.number = event.turn;
      localStorage.setItem(storeKey, event.session_id);
      if (event.session_token) localStorage.setItem(tokenKey, event.session_token);
    } else if (event.type === "sources") { turn.sources = event.sources; }
    else if (event.type === "restart") {  // what was shown is replaced by what follows
      turn.answer = "";
      renderAnswer(turn.bot, turn.answer, turn.sources);
    } else if (event.type === "token") {
      if (!turn.started) { turn.started = true; turn.answer = ""; }
      turn.answer += event.content;
      renderAnswer(turn.bot, turn.answer, turn.sources);
    } else if (event.type === "complete") {
      localStorage.removeItem(streamKey);
      if (event.session_id && event.session_token) {
        localStorage.setItem(storeKey, event.session_id);
        localStorage.setItem(tokenKey, event.session_token);
      }
      var meta = event.metadata || {};
      if (meta.blocked) turn.bot.className = "cw-msg cw-notice";
      if (!turn.started) turn.bot.textContent = turn.answer || "";
      if (meta.route === "HANDOFF" && !turn.answer) turn.bot.remove();  // written while waiting or held: no answer
      if (meta.route === "ANSWER" && !meta.blocked) votes(event.turn || turn.number);
      finish(meta);
      // A handoff nobody can take (out of hours) or an e-mail left for the team: nothing to wait for.
      if (meta.route === "HANDOFF" && meta.handoff !== "") handedOff(handoff || "waiting", handoffOperator);
      scroll();
      return true;
    } else if (event.type === "error") {
      localStorage.removeItem(streamKey);
      turn.bot.className = "cw-msg cw-error";
      turn.bot.textContent = event.message;
      scroll();
      return true;
    }
    if (turn.number) remember(turn);
    scroll();
    return false;
  }

  // Read frames until `handle` says the stream is done (true) or the connection ends first (false).
  function follow(resp, handle) {
    var reader = resp.body.getReader(), decoder = new TextDecoder(), buffer = "";
    function pump() {
      return reader.read().then(function (chunk) {
        if (chunk.done) return false;
        buffer += decoder.decode(chunk.value, {stream: true});
        var blocks = buffer.split("\n\n");
        buffer = blocks.pop();
        for (var i = 0; i < blocks.length; i++) if (handle(blocks[i])) return true;
        return pump();
      });
    }
    return pump().catch(function () { return false; });
  }

  function fatal(message) {  // an error no retry can help
    var err = new Error(message);
    err.final = true;
    return err;
  }

  function reopen(turn) {
    var headers = {"X-Session-Token": localStorage.getItem(tokenKey)};
    if (turn.last) headers["Last-Event-ID"] = turn.last;
    return fetch(api + "/v1/sites/" + encodeURIComponent(site) + "/conversations/" +
                 encodeURIComponent(localStorage.getItem(storeKey)) + "/turns/" + turn.number + "/stream",
                 {headers: headers}).then(function (resp) {
      if (!resp.ok && resp.status < 500) {  // no such turn, or no longer this visitor's: nothing to resume
        localStorage.removeItem(streamKey);
        throw fatal("The answer could not be resumed. Please ask again.");
      }
      if (!resp.ok) throw new Error("The assistant is unavailable.");
      return resp;
    });
  }

  // After a try that failed in transit, the next one when its pause is over: the turn resumed
  // after the last frame read once its `start` frame named it, else the message sent again.
  // `err` once the pauses are spent.
  function again(turn, err) {
    if (turn.tries >= RETRY_PAUSES_MS.length) {
      localStorage.removeItem(streamKey);
      return Promise.reject(err);
    }
    var pause = RETRY_PAUSES_MS[turn.tries++];
    return new Promise(function (ok) { setTimeout(ok, pause); }).then(function () {
      return turn.number ? resume(turn) : post(turn);
    });
  }

  // Follow a turn to its end; a connection that ends first is tried again.
  function stream(turn, resp) {
    return follow(resp, function (block) { return take(turn, block); }).then(function (ended) {
      if (!ended) {
        return again(turn, new Error(turn.number ? "The connection was lost. Please ask again."
                                                 : "The assistant is unavailable."));
      }
    });
  }

  function resume(turn) {
    return reopen(turn).then(function (resp) { return stream(turn, resp); },
                             function (err) { if (err.final) throw err; return again(turn, err); });
  }

  // What the page knows of the visitor, sent with each message (schemas.py `Visitor`): the page
  // and where it was reached from (origin and path: a query string may hold personal data), and
  // what the site's own page passes in `window.ConciergeIdentity` (an object, or a function that
  // returns one, read at each message): `reveal` (a reveal provider's browser result, e.g.
  // {company, domain}), `session_uuid` (a session-identification provider's id), `person_id`
  // (the site's id of a person it knows), `email_hash` (SHA-256 of their lower-case e-mail).
  // Anything else is left out and what would be refused is dropped, so a page's mistake never
  // costs the visitor their message. Not the browser's language: the message's own says more.
  function visitor() {
    var out = {page_url: (location.origin + location.pathname).slice(0, 2048)};
    try {
      var from = document.referrer ? new URL(document.referrer) : null;
      if (from) out.referrer = (from.origin + from.pathname).slice(0, 2048);
    } catch (e) { /* not a URL: left out */ }
    var given = window.ConciergeIdentity;
    try { if (typeof given === "function") given = given(); } catch (e) { given = null; }
    if (!given || typeof given !== "object") return out;
    if (typeof given.session_uuid === "string" && given.session_uuid) out.session_uuid = given.session_uuid.slice(0, 256);
    if (typeof given.person_id === "string" && /^[\x21-\x7e]{1,128}$/.test(given.person_id)) out.person_id = given.person_id;
    if (typeof given.email_hash === "string" && /^[0-9a-f]{64}$/.test(given.email_hash)) out.email_hash = given.email_hash;
    if (given.reveal && typeof given.reveal === "object") {
      var reveal = {}, kept = 0;
      Object.keys(given.reveal).forEach(function (key) {
        var value = given.reveal[key];
        if (kept < 20 && key.length <= 64 && (typeof value === "string" || typeof value === "number")) {
          reveal[key] = String(value).slice(0, 256); kept++;
        }
      });
      if (kept) out.reveal = reveal;
    }
    return out;
  }

  // Send the visitor's message, or send it again (the same id) after a try that failed before
  // its turn's `start` frame came: the gateway may or may not have started the turn.
  function post(turn) {
    var session = localStorage.getItem(storeKey), token = localStorage.getItem(tokenKey);
    if (!session || !token) session = null;  // no token: the conversation cannot be resumed, start anew
    return fetch(api + "/v1/chat", {
      method: "POST",
      headers: {"content-type": "application/json"},
      body: JSON.stringify({site: site, session_id: session, session_token: session ? token : null,
                            message: turn.text, client_message_id: turn.id, visitor: visitor()})
    }).then(function (resp) {
      if (resp.status === 403 && session) {  // the token is no longer valid: start a new conversation
        localStorage.removeItem(storeKey);
        localStorage.removeItem(tokenKey);
        throw fatal("This conversation could not be resumed. Please send your message again.");
      }
      if (resp.ok) {
        var sid = resp.headers.get("X-Session-Id"), stoken = resp.headers.get("X-Session-Token");
        if (sid && stoken) { localStorage.setItem(storeKey, sid); localStorage.setItem(tokenKey, stoken); }
        return stream(turn, resp);
      }
      return resp.json().catch(function () { return {}; }).then(function (b) {
        // Nothing was started: the session's last turn has not ended yet (or its gateway died
        // holding it), another gateway got there first, or the bus is down. Soon, again.
        var inProgress = resp.status === 429 && b.error === "turn_in_progress";
        if (inProgress || resp.status === 409 || resp.status === 503) {
          return again(turn, new Error(inProgress ? "One message at a time, please — or wait a moment and try again."
                                                  : "The assistant is unavailable."));
        }
        throw fatal((b.detail && b.detail[0] && b.detail[0].message) || b.detail || "The assistant is unavailable.");
      });
    }, function () {  // a network error: the message may or may not have reached the gateway
      return again(turn, new Error("The assistant is unavailable."));
    });
  }

  function failed(turn) {
    return function (err) {
      turn.bot.className = "cw-msg cw-error";
      turn.bot.textContent = err.message || "The assistant is unavailable.";
    };
  }

  function idle() { busy = false; send.disabled = false; scroll(); }

  function ask(text) {
    busy = true; send.disabled = true;
    input.value = "";
    if (starters) { starters.remove(); starters = null; }
    if (!handoff) handoffStatus.textContent = "";  // how the last handoff ended, said once
    log.appendChild(el("div", "cw-msg cw-user", text));
    var turn = bubble();
    turn.text = text;
    turn.id = messageId();
    post(turn).catch(failed(turn)).then(idle);
  }

  // --- a handoff: the operators' side of the conversation, from its live channel ---
  var handoff = "", handoffOperator = "";  // "" | waiting | held, and who holds it
  var listening = null;  // the live channel while open: {session, abort}
  var shownByOperator = {};  // the operator messages shown (a frame may repeat one the view showed)

  function note(text) {
    var line = el("div", "cw-event", text);
    line.setAttribute("data-testid", "cw-handoff-event");
    log.appendChild(line);
    scroll();
  }

  function operatorBubble(m) {
    var key = [m.operator, m.ts, m.text].join("\n");
    if (shownByOperator[key]) return;
    shownByOperator[key] = true;
    var node = el("div", "cw-msg cw-bot cw-operator");
    node.setAttribute("data-testid", "cw-operator");
    node.appendChild(el("span", "cw-operator-name", m.operator));
    node.appendChild(el("span", null, m.text));
    log.appendChild(node);
    scroll();
  }

  // What the site says when nobody could take the handoff: a bot message, shown once.
  function noticeBubble(text, ts) {
    var key = ["notice", ts, text].join("\n");
    if (shownByOperator[key]) return;
    shownByOperator[key] = true;
    var node = el("div", "cw-msg cw-bot cw-notice", text);
    node.setAttribute("data-testid", "cw-notice");
    log.appendChild(node);
    scroll();
  }

  // The handoff stands at `status`: said in the status line, and the live channel opened.
  function handedOff(status, operator) {
    handoff = status; handoffOperator = operator || "";
    handoffStatus.textContent = status === "held" && operator ? operator + " joined the conversation"
                                                              : "Connecting you with the team…";
    listen();
  }

  function onLive(event) {
    if (event.type === "operator_joined") {
      note(event.operator + " joined the conversation");
      handoff = "held"; handoffOperator = event.operator;
      handoffStatus.textContent = event.operator + " joined the conversation";
    } else if (event.type === "operator_message") {
      operatorBubble(event);
    } else if (event.type === "operator_left") {
      note(event.operator + " left");
      handoff = "waiting"; handoffOperator = "";
      handoffStatus.textContent = "Connecting you with the team…";
    } else if (event.type === "handoff_ended") {
      handoff = ""; handoffOperator = "";
      if (event.message) {  // nobody could take it: the e-mail follow-up is offered
        noticeBubble(event.message, event.ts);
        handoffStatus.textContent = "";
      } else if (event.outcome === "released" || event.outcome === "closed") {
        var said = event.outcome === "closed" ? "The conversation was closed"
                                              : "The conversation is back with the assistant";
        note(said);
        handoffStatus.textContent = said;
      } else {
        handoffStatus.textContent = "";  // out of hours: the turn's reply said so
      }
      return true;
    }
    return false;
  }

  function stopListening() {
    if (listening) { listening.abort(); listening = null; }
  }

  // The live channel of the conversation, kept open until the handoff ends (or the visitor
  // starts a new conversation): each frame's id is kept, so a dropped connection or a reload
  // goes on after it; a drop is followed by another try after a pause, for as long as it lasts.
  function listen() {
    var session = localStorage.getItem(storeKey), token = localStorage.getItem(tokenKey);
    if (!session || !token || (listening && listening.session === session)) return;
    stopListening();
    var controller = new AbortController(), tries = 0;
    var mine = listening = {session: session, abort: function () { controller.abort(); }};
    function lastId() {
      var kept = JSON.parse(localStorage.getItem(liveKey) || "null");
      return kept && kept.session === session ? kept.last : null;
    }
    function handle(block) {
      var frame = parseFrame(block);
      if (!frame) return false;
      tries = 0;
      if (frame.id) localStorage.setItem(liveKey, JSON.stringify({session: session, last: frame.id}));
      return onLive(frame.event);
    }
    function connect() {
      if (listening !== mine) return;
      var headers = {"X-Session-Token": token}, last = lastId();
      if (last) headers["Last-Event-ID"] = last;
      fetch(api + "/v1/sites/" + encodeURIComponent(site) + "/conversations/" + encodeURIComponent(session) + "/live",
            {headers: headers, signal: controller.signal}).then(function (resp) {
        if (!resp.ok && resp.status < 500) return true;  // no longer this visitor's: nothing to listen to
        return resp.ok ? follow(resp, handle) : false;
      }).catch(function () { return false; }).then(function (done) {
        if (listening !== mine) return;
        if (done) { listening = null; controller.abort(); return; }
        var pause = RETRY_PAUSES_MS[Math.min(tries++, RETRY_PAUSES_MS.length - 1)];
        setTimeout(connect, pause);
      });
    }
    connect();
  }

  // After a reload: the visitor's own view of the conversation (its token required), and the
  // answer that was streaming, resumed from its first frame (the page lost what it showed).
  var saved = localStorage.getItem(storeKey), savedToken = localStorage.getItem(tokenKey);
  var streaming = JSON.parse(localStorage.getItem(streamKey) || "null");
  var restored = Promise.resolve();
  if (saved && savedToken) {
    restored = fetch(api + "/v1/sites/" + encodeURIComponent(site) + "/conversations/" + encodeURIComponent(saved),
          {headers: {"X-Session-Token": savedToken}})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (view) {
        if (!view) return;
        var messages = view.messages || [];
        messages.forEach(function (m) {
          if (m.role === "operator") { operatorBubble({operator: m.operator, ts: m.ts, text: m.content}); return; }
          if (m.role === "notice") { noticeBubble(m.content, m.ts); return; }
          if (m.role === "assistant" && !m.content && m.route === "HANDOFF") return;  // written while held
          var node = el("div", "cw-msg " + (m.role === "user" ? "cw-user" : "cw-bot"));
          if (m.role === "assistant") {
            node.setAttribute("data-testid", "cw-bot");
            renderAnswer(node, m.content, m.sources);
          } else {
            node.textContent = m.content;
          }
          log.appendChild(node);
          if (m.role === "assistant" && m.route === "ANSWER") votes(m.turn, m.rating);
        });
        if (messages.length) panel.classList.add("cw-open");
        var answered = streaming && messages.some(function (m) {
          return m.role === "assistant" && m.turn === streaming.turn;
        });
        if (streaming && streaming.turn && !answered) {
          busy = true; send.disabled = true;
          var turn = bubble();
          turn.number = streaming.turn;
          resume(turn).catch(failed(turn)).then(idle);
        } else {
          localStorage.removeItem(streamKey);
          if (messages.length) finish(view.last);
        }
        var standing = view.handoff || {};
        if (standing.status === "waiting" || standing.status === "held") handedOff(standing.status, standing.operator);
        scroll();
      });
  }
  // The greeting and the starter questions once the look is known and nothing was restored.
  Promise.all([readSettings(), restored.catch(function () {})]).then(welcome);
})();
