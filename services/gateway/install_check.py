"""Is the widget on the site's page? What the console's "Check installation" asks: the page
fetched as a browser would (through the outbound guard, as every URL an operator gives), its
`<script>` tags read with the standard library's HTML parser, and the answer is whether the
snippet is there, for this site, on an origin the site allows (else the widget's calls
would be refused: cors.py). A check's result, not an error: a page that cannot be reached or
is refused says why in `problems`."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlsplit

from services.gateway.cors import origin_allowed
from shared.site_config import SiteConfig
from shared.web import FetchError, RefusedAddress, WebClient, origin

CHECKS_PER_MIN = 10  # a site's installation checks a minute (gateway app: its limiter)
PAGE_BYTES = 2 * 1024 * 1024  # a page's HTML read this far: the snippet sits before </body>, usually far less


class _Scripts(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.found.append({k: v or "" for k, v in attrs})

    handle_startendtag = handle_starttag


def widget_scripts(html: str) -> list[dict[str, str]]:
    """The attributes of each `<script>` whose src is a `widget.js`."""
    parser = _Scripts()
    parser.feed(html)
    parser.close()
    return [a for a in parser.found if urlsplit(a.get("src", "")).path.endswith("/widget.js")]


async def check(web: WebClient, url: str, site: str, config: SiteConfig, gateway_host: str | None) -> dict:
    result = {"url": url, "status": None, "installed": False, "widget_site": None, "origin": origin(url),
              "origin_allowed": False, "ok": False, "problems": []}
    problems = result["problems"]
    try:
        page = await web.get(url, headers={"Accept": "text/html"}, max_bytes=PAGE_BYTES)
    except RefusedAddress as exc:
        problems.append(f"refused: {exc}")
        return result
    except FetchError as exc:
        problems.append(f"could not fetch the page: {exc}")
        return result
    result.update(url=page.url, status=page.status, origin=origin(page.url))
    if page.status != 200:
        problems.append(f"the page answered HTTP {page.status}")
        return result
    scripts = widget_scripts(page.text())
    mine = [s for s in scripts if s.get("data-site") == site]
    result["installed"] = bool(mine)
    result["widget_site"] = (mine or scripts or [{}])[0].get("data-site")
    if not scripts:
        problems.append("the page has no widget script: paste the snippet before </body>")
    elif not mine:
        problems.append(f"the widget on the page is for site {result['widget_site']!r}, not {site!r}")
    result["origin_allowed"] = origin_allowed(result["origin"], gateway_host, config)
    if not result["origin_allowed"]:
        problems.append(f"{result['origin']} is not among the site's allowed origins: the widget's calls from it "
                        "would be refused (add it in Settings)")
    result["ok"] = not problems
    return result
