// "Add a site": one guided path from a name and a website to a live assistant. The site is
// made (ADMIN_TOKEN: PUT /v1/admin/sites/{site}, its website's origin allowed), its home page
// added as a source (the retriever reads its sitemap too), the run's progress shown as it goes
// (pages found, read, failed and why), then the assistant tried in a frame, and the snippet
// given with a copy button and a check that a page of the site embeds it.
import { $, el, problem, fieldErrors, showFieldErrors, headerView, adminFetch, linkTo, sleep } from "./core.js";

const view = headerView("onboardingView", "addSite", "Add a site", () => { if (!running) reset(); });
const STEPS = ["stepSite", "stepRead", "stepTry", "stepInstall"];
let running = false, idEdited = false;

async function call(site, method, path = "", body) {
  const response = await adminFetch(`/v1/admin/sites/${encodeURIComponent(site)}${path}`, {
    method, body: body === undefined ? undefined : JSON.stringify(body), headers: { "Content-Type": "application/json" } });
  return { status: response.status, body: await response.json().catch(() => ({})) };
}

function step(id) {
  const at = STEPS.indexOf(id);
  STEPS.forEach((s, i) => {
    $(s).classList.toggle("done", i < at);
    if (i === at) $(s).setAttribute("aria-current", "step"); else $(s).removeAttribute("aria-current");
  });
}

function reset() {
  step("stepSite");
  for (const id of ["onboardRead", "onboardTry", "onboardInstall"]) $(id).hidden = true;
  $("onboardForm").hidden = false;
  showFieldErrors($("onboardForm"), [], $("onboardErrors"));
}

// The site id follows the name (lower case, dashes) until it is typed in itself.
const slug = (name) => name.toLowerCase().normalize("NFKD").replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 40);
$("onboardName").addEventListener("input", () => { if (!idEdited) $("onboardSite").value = slug($("onboardName").value); });
$("onboardSite").addEventListener("input", () => { idEdited = $("onboardSite").value !== ""; });

function given() {
  const name = $("onboardName").value.trim(), site = $("onboardSite").value.trim(), errors = [];
  let url = null;
  try { url = new URL($("onboardUrl").value.trim()); } catch (error) { url = null; }
  if (!name) errors.push({ field: "name", message: "the name visitors know you by" });
  if (!url || !["http:", "https:"].includes(url.protocol)) errors.push({ field: "url", message: "an http or https address, e.g. https://www.example.com" });
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(site)) errors.push({ field: "site", message: "1 to 64 letters, digits, - or _" });
  return { name, site, url, errors };
}

$("onboardForm").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = $("onboardForm"), { name, site, url, errors } = given();
  showFieldErrors(form, errors, $("onboardErrors"));
  if (errors.length) return;
  if ((await call(site, "GET")).status === 200) {
    showFieldErrors(form, [{ field: "site", message: `a site ${site} exists already: choose another id` }], $("onboardErrors"));
    return;
  }
  const made = await call(site, "PUT", "", { name, allowed_origins: [url.origin] });
  if (made.status !== 201) {
    showFieldErrors(form, fieldErrors(made).map((d) => ({ ...d, field: d.field === "allowed_origins[0]" ? "url" : d.field })),
                    $("onboardErrors"));
    if (!fieldErrors(made).length) $("onboardErrors").textContent = problem(made);
    return;
  }
  $("site").value = site;
  sessionStorage.setItem("concierge-admin-site", site);
  $("siteChoices").append(Object.assign(document.createElement("option"), { value: site }));
  linkTo("new");
  const added = await call(site, "POST", "/sources", { url: url.href });
  if (added.status !== 202) { $("onboardErrors").textContent = problem(added); return; }
  form.hidden = true;
  $("onboardSnippet").textContent = made.body.snippet;
  $("onboardOrigin").textContent = url.origin;
  $("onboardCheckUrl").value = url.href;
  read(site, added.body.source, url.href);
});

// The run, asked every second until it ends: how many pages it knows of, how many are done,
// and each page that failed or is gone, with the reason.
async function read(site, source, from) {
  running = true;
  step("stepRead");
  $("onboardRead").hidden = false; $("onboardAgain").hidden = true;
  $("onboardFrom").textContent = from;
  try {
    for (;;) {
      const answer = await call(site, "GET", `/sources/${source}`);
      if (answer.status !== 200) { $("onboardCounts").textContent = problem(answer); return; }
      const s = answer.body.source, p = s.progress || { pages: 0, done: 0, failed: 0 };
      $("onboardBar").style.width = `${Math.round(100 * p.done / Math.max(1, p.pages))}%`;
      const found = s.sitemap ? `${p.pages} pages found (with ${s.sitemap})` : `${p.pages} pages found`;
      $("onboardCounts").textContent = `${found} · ${p.done} read · ${p.failed} failed`;
      const bad = s.pages.filter((page) => page.outcome === "failed" || page.outcome === "gone").slice(0, 20);
      $("onboardProblems").replaceChildren(...bad.map((page) => el("li", `${page.url}: ${page.reason || page.outcome}`)));
      if (s.state === "completed") {
        const c = s.last_completed;
        $("onboardBar").style.width = "100%";
        $("onboardCounts").textContent = `Done: ${c.pages} pages read, ${c.added + c.replaced + c.unchanged} kept ` +
          `(${c.chunks} passages), ${c.failed} failed${s.sitemap ? ` · sitemap ${s.sitemap}` : ""}.`;
        ready(site);
        return;
      }
      if (s.state === "failed") {
        $("onboardCounts").textContent = `The website could not be read: ${s.last_failure ? s.last_failure.reason : "unknown"}`;
        $("onboardAgain").hidden = false;
        $("onboardAgain").onclick = async () => { await call(site, "POST", `/sources/${source}/sync`); read(site, source, from); };
        return;
      }
      await sleep(1000);
    }
  } finally { running = false; }
}

// The assistant, as a visitor will see it, in a frame of the console (its own origin is allowed).
function ready(site) {
  step("stepTry");
  $("onboardTry").hidden = false; $("onboardInstall").hidden = false;
  const frame = $("onboardPreview");
  frame.onload = () => {
    const doc = frame.contentDocument, script = doc.createElement("script");
    script.src = "/widget.js";
    script.setAttribute("data-site", site);
    script.setAttribute("data-open", "");
    doc.body.append(script);
  };
  frame.srcdoc = "<!doctype html><html><head><meta charset='utf-8'></head><body></body></html>";
}

$("onboardCopy").addEventListener("click", async () => {
  try { await navigator.clipboard.writeText($("onboardSnippet").textContent); $("status").textContent = "snippet copied"; }
  catch (error) { getSelection().selectAllChildren($("onboardSnippet")); $("status").textContent = "press Ctrl+C to copy"; }
});

$("onboardCheck").addEventListener("click", async () => {
  const site = $("site").value.trim(), box = $("onboardChecked");
  step("stepInstall");
  box.className = ""; box.textContent = "Checking…";
  const answer = await call(site, "POST", "/install-check", { url: $("onboardCheckUrl").value.trim() });
  if (answer.status !== 200) { box.className = "error"; box.textContent = problem(answer); return; }
  if (answer.body.ok) {
    box.className = "good";
    box.textContent = `Installed: ${answer.body.url} loads your assistant. Your visitors can ask it now.`;
    $("stepInstall").classList.add("done");
  } else {
    box.className = "error";
    box.replaceChildren(el("div", `Not yet, on ${answer.body.url}:`), ...answer.body.problems.map((p) => el("div", p)));
  }
});
