import { $, el, status, problem, headerView, siteCall } from "./core.js";

(() => {
  // `$`, `el` and `headerView` are the page's own (the first script).
  const view = headerView("siteView", "siteSettings", "Site", () => loadSite());
  const node = el;
  let exists = false, current = null;

  const call = siteCall;
  const problem = (answer) => typeof answer.body.detail === "string" ? answer.body.detail
    : (answer.body.detail || []).map((d) => d.message).join("; ") || `HTTP ${answer.status}`;

  // The form ⇄ the config's fields (the form's ids are site-<field, dots as dashes>).
  const TEXT = ["name", "widget.title", "widget.greeting", "widget.launcher_text", "widget.primary_color",
                "widget.background_color", "widget.text_color", "widget.position", "widget.avatar_url",
                "cta.label", "cta.url", "cta.booking_url"];
  const input = (field) => $("site-" + field.replaceAll(".", "-"));
  const at = (config, field) => field.split(".").reduce((v, k) => (v || {})[k], config);
  const lines = (text) => text.split("\n").map((s) => s.trim()).filter(Boolean);

  function fill(config) {
    for (const field of TEXT) input(field).value = at(config, field) ?? "";
    input("allowed_origins").value = (config.allowed_origins || []).join("\n");
    input("languages").value = (config.languages || []).join(", ");
    input("widget.starter_questions").value = (config.widget.starter_questions || []).join("\n");
    input("widget.show_sources").checked = config.widget.show_sources;
    syncPickers();
  }

  function edited() {
    const config = { widget: {}, cta: {} };
    for (const field of TEXT) {
      const [table, key] = field.includes(".") ? field.split(".") : [null, field];
      if (table) config[table][key] = input(field).value; else config[key] = input(field).value;
    }
    config.allowed_origins = lines(input("allowed_origins").value);
    config.languages = input("languages").value.split(",").map((s) => s.trim()).filter(Boolean);
    config.widget.starter_questions = lines(input("widget.starter_questions").value);
    config.widget.show_sources = input("widget.show_sources").checked;
    return config;
  }

  function showErrors(errors) {
    for (const box of view.querySelectorAll(".field")) {
      box.classList.remove("invalid");
      box.querySelector(".field-error").textContent = "";
    }
    const general = [];
    for (const error of errors) {
      const field = (error.field || "").replace(/\[\d+\]$/, "");
      const box = field && view.querySelector(`.field[data-field="${CSS.escape(field)}"]`);
      if (box) {
        box.classList.add("invalid");
        const text = box.querySelector(".field-error");
        text.textContent = (text.textContent ? text.textContent + "; " : "") + error.message;
      } else general.push(`${error.field || "config"}: ${error.message}`);
    }
    $("siteFormErrors").textContent = general.join("; ");
  }

  function syncPickers() {
    for (const picker of view.querySelectorAll("input[type=color]")) {
      const text = $(picker.dataset.for).value;
      if (/^#[0-9a-f]{6}$/i.test(text)) picker.value = text;
      else if (/^#[0-9a-f]{3}$/i.test(text)) picker.value = "#" + [...text.slice(1)].map((c) => c + c).join("");
    }
  }
  for (const picker of view.querySelectorAll("input[type=color]")) {
    picker.addEventListener("input", () => { $(picker.dataset.for).value = picker.value; preview(); });
  }

  // The preview: the widget itself in a frame, with the form's settings over the saved ones.
  let pending = null;
  function preview() {
    clearTimeout(pending);
    pending = setTimeout(() => {
      const frame = $("sitePreview"), site = $("site").value.trim(), settings = edited().widget;
      frame.onload = () => {
        const doc = frame.contentDocument;
        doc.body.append(Object.assign(doc.createElement("p"), { textContent: "A page of the site." }));
        const script = doc.createElement("script");
        script.src = "/widget.js";
        script.setAttribute("data-site", site);
        script.setAttribute("data-open", "");
        script.setAttribute("data-settings", JSON.stringify(settings));
        doc.body.append(script);
      };
      frame.srcdoc = "<!doctype html><html><head><meta charset='utf-8'></head><body style='font:14px system-ui;color:#5b6672'></body></html>";
    }, 250);
  }
  $("siteForm").addEventListener("input", () => { syncPickers(); preview(); });

  function showSite(body) {
    exists = true; current = body.config;
    $("siteWhich").textContent = `${body.site} · version ${body.version}`;
    $("siteState").textContent = "";
    $("siteSnippet").textContent = body.snippet;
    $("siteDelete").hidden = false;
    const keys = $("siteKeys"); keys.replaceChildren();
    for (const digest of body.config.operator_key_sha256) {
      const row = node("div", null, "row");
      const retire = node("button", "Retire");
      retire.type = "button";
      retire.addEventListener("click", () => retireKey(digest));
      row.append(node("code", digest.slice(0, 12) + "…"), " ", retire);
      keys.append(row);
    }
    if (!body.config.operator_key_sha256.length) keys.append(node("div", "(none: only the ADMIN_TOKEN)", "muted"));
  }

  async function loadSite() {
    const site = $("site").value.trim();
    showErrors([]); $("siteKeyOnce").hidden = true;
    if (!site) { $("siteState").textContent = "Enter a site id above."; return; }
    const answer = await call("GET");
    if (answer.status === 404) {
      exists = false; current = null;
      $("siteWhich").textContent = site;
      $("siteState").textContent = `No site ${site} yet: fill in the form and save to create it (ADMIN_TOKEN).`;
      $("siteSnippet").textContent = ""; $("siteKeys").replaceChildren(); $("siteVersions").replaceChildren();
      $("siteDelete").hidden = true;
      fill({ name: "", allowed_origins: [], languages: ["en"], cta: { label: "Book a demo", url: "", booking_url: "" },
             widget: { primary_color: "#0b5cad", background_color: "#ffffff", text_color: "#1b1f24", title: "Ask us anything",
                       greeting: "", launcher_text: "Chat with us", position: "right", avatar_url: "", starter_questions: [],
                       show_sources: true } });
      preview();
      return;
    }
    if (answer.status !== 200) { $("siteState").textContent = problem(answer); $("siteState").className = "error"; return; }
    $("siteState").className = "muted";
    showSite(answer.body);
    fill(answer.body.config);
    preview();
    loadVersions();
  }

  async function loadVersions() {
    const answer = await call("GET", "/versions");
    const box = $("siteVersions"); box.replaceChildren();
    for (const v of (answer.body.versions || []).slice(0, 20)) {
      const c = v.change;
      box.append(node("div", v.deleted ? `${v.revision} · deleted`
        : `${v.revision} · ${v.version} · ${c ? new Date(c.ts * 1000).toLocaleString() + " · " + c.change + " by " + c.actor + (c.fields_changed.length ? ": " + c.fields_changed.join(", ") : "") : ""}`,
        "muted"));
    }
  }

  $("siteForm").addEventListener("submit", async (e) => {
    e.preventDefault();
    const answer = await call(exists ? "PATCH" : "PUT", "", edited());
    if (answer.status === 422) { showErrors(answer.body.errors || answer.body.detail || []); $("status").textContent = "not saved: see the fields"; return; }
    if (answer.status >= 300) { showErrors([]); $("siteFormErrors").textContent = problem(answer); return; }
    showErrors([]);
    $("status").textContent = answer.status === 201 ? "site created" : "saved";
    showSite(answer.body);
    loadVersions();
  });

  $("siteDelete").addEventListener("click", async () => {
    const site = $("site").value.trim();
    if (!confirm(`Delete site ${site}? Its conversations and earlier versions stay in the log.`)) return;
    const answer = await call("DELETE");
    if (answer.status !== 200) { $("siteFormErrors").textContent = problem(answer); return; }
    $("status").textContent = `site ${site} deleted`;
    loadSite();
  });

  $("siteNewKey").addEventListener("click", async () => {
    const answer = await call("POST", "/keys");
    if (answer.status !== 201) { $("siteFormErrors").textContent = problem(answer); return; }
    const once = $("siteKeyOnce");
    once.replaceChildren(node("div", "The new key, shown this once (it works within seconds):"), node("code", answer.body.key));
    once.hidden = false;
    const shown = await call("GET");
    if (shown.status === 200) showSite(shown.body);
    loadVersions();
  });

  async function retireKey(digest) {
    if (!confirm("Retire this key? Whoever uses it loses access within seconds.")) return;
    const answer = await call("PATCH", "", { operator_key_sha256: current.operator_key_sha256.filter((d) => d !== digest) });
    if (answer.status !== 200) { $("siteFormErrors").textContent = problem(answer); return; }
    showSite(answer.body);
    loadVersions();
  }

  $("siteCopy").addEventListener("click", async () => {
    try { await navigator.clipboard.writeText($("siteSnippet").textContent); $("status").textContent = "snippet copied"; }
    catch (error) { getSelection().selectAllChildren($("siteSnippet")); $("status").textContent = "press Ctrl+C to copy"; }
  });
})();
