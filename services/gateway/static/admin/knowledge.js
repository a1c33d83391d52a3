import { $, el, status, problem, headerView, siteCall } from "./core.js";

(() => {
  // `$`, `el`, `headerView` and `problem` are the page's own (the first script).
  const view = headerView("knowledgeView", "knowledge", "Knowledge", () => loadSources());
  const site = () => $("site").value.trim();
  const call = (method, path, body, type) => siteCall(method, path, body, { type });
  const list = (text) => text.split(",").map((s) => s.trim()).filter(Boolean);
  let timer = null, opened = null;

  function line(source) {
    const row = el("div", null, "source");
    row.dataset.source = source.id;
    row.append(el("div", source.url || source.name || source.title, "what"));
    const meta = el("div", null, "muted");
    meta.append(el("span", `${source.kind} · run ${source.run} `), el("span", source.state,
      "tag " + (source.state === "completed" ? "good" : source.state === "failed" ? "bad" : "")));
    if (source.every_s) meta.append(el("span", ` · every ${Math.round(source.every_s / 3600)} h`));
    row.append(meta);
    if (source.progress && (source.state === "running" || source.state === "queued")) {
      const bar = el("div", null, "bar"), fill = el("div");
      fill.style.width = `${Math.round(100 * source.progress.done / Math.max(1, source.progress.pages))}%`;
      bar.append(fill);
      row.append(bar, el("div", `${source.progress.done} of ${source.progress.pages} pages`, "muted progress"));
    }
    const done = source.last_completed;
    if (done) row.append(el("div", `last sync ${new Date(done.ts * 1000).toLocaleString()}: ${done.pages} pages · ` +
      `${done.added} added · ${done.replaced} updated · ${done.unchanged} unchanged · ${done.removed} removed · ` +
      `${done.failed} failed · ${done.chunks} chunks`, "muted counts"));
    if (source.last_failure && source.last_failure.run === source.run)
      row.append(el("div", `run ${source.run} failed: ${source.last_failure.reason}`, "error"));
    const sync = el("button", "Sync now"), pages = el("button", "Pages"), remove = el("button", "Remove");
    sync.className = "sync";
    sync.addEventListener("click", async () => {
      const answer = await call("POST", `sources/${source.id}/sync`);
      $("knowledgeErrors").textContent = answer.status === 202 ? "" : problem(answer);
      loadSources();
    });
    pages.addEventListener("click", () => showPages(source.id));
    remove.addEventListener("click", async () => {
      if (!confirm("Remove this source? Its pages leave the knowledge base.")) return;
      await call("DELETE", `sources/${source.id}`);
      loadSources();
    });
    row.append(sync, pages, remove);
    return row;
  }

  async function loadSources() {
    clearTimeout(timer);
    $("knowledgeWhich").textContent = site();
    const answer = await call("GET", "sources");
    if (answer.status !== 200) { $("knowledgeErrors").textContent = problem(answer); return; }
    const box = $("sources");
    box.replaceChildren(...answer.body.sources.map(line));
    if (!answer.body.sources.length) box.append(el("div", "No sources yet: add the site's website below.", "muted"));
    if (opened) showPages(opened);
    // While a run is going, its progress is read again every 2 s.
    if (answer.body.sources.some((s) => s.state === "running" || s.state === "queued") && !view.hidden)
      timer = setTimeout(loadSources, 2000);
  }

  async function showPages(id) {
    opened = id;
    const answer = await call("GET", `sources/${id}`);
    if (answer.status !== 200) return;
    const source = answer.body.source;
    $("pagesWhich").textContent = `${source.url || source.name || source.title} · run ${source.run}`;
    const table = el("table"), body = el("tbody");
    const head = el("tr");
    for (const h of ["page", "outcome", "why"]) head.append(el("th", h));
    table.append(head, body);
    const order = { failed: 0, gone: 1, skipped: 2, changed: 3, unchanged: 4 };
    for (const page of [...source.pages].sort((a, b) => order[a.outcome] - order[b.outcome])) {
      const tr = el("tr", null, "row");
      tr.append(el("td", page.title ? `${page.title} — ${page.url}` : page.url), el("td", page.outcome), el("td", page.reason));
      body.append(tr);
    }
    $("sourcePages").replaceChildren(table);
  }

  $("sourceAdd").addEventListener("click", async () => {
    const answer = await call("POST", "sources", JSON.stringify({
      url: $("sourceUrl").value.trim(), every: $("sourceEvery").value || null, include: list($("sourceInclude").value),
      exclude: list($("sourceExclude").value), max_pages: Number($("sourceMax").value) || 500 }));
    $("knowledgeErrors").textContent = answer.status === 202 ? "" : problem(answer);
    loadSources();
  });
  $("snippetAdd").addEventListener("click", async () => {
    const answer = await call("POST", "sources", JSON.stringify({ title: $("snippetTitle").value, text: $("snippetText").value }));
    $("knowledgeErrors").textContent = answer.status === 202 ? "" : problem(answer);
    loadSources();
  });
  $("sourceUpload").addEventListener("click", async () => {
    const errors = [];
    for (const file of $("sourceFiles").files) {
      const answer = await call("POST", `uploads?name=${encodeURIComponent(file.name)}`, file, "application/octet-stream");
      if (answer.status !== 202) errors.push(`${file.name}: ${problem(answer)}`);
    }
    $("knowledgeErrors").textContent = errors.join("; ");
    loadSources();
  });
})();
