"""axe-core, the accessibility engine (Deque, MPL-2.0, used unmodified), for the browser
tests: its pinned release is taken from the npm registry once, checked against the
registry's integrity hash, and kept in CONCIERGE_CACHE_DIR (as the real-site eval's docs
are: cli/measure/evals/site_corpus.py); `violations` runs it in a page."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import urllib.request
from pathlib import Path

VERSION = "4.14.1"
TARBALL = f"https://registry.npmjs.org/axe-core/-/axe-core-{VERSION}.tgz"
INTEGRITY = "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ=="
SERIOUS = ("serious", "critical")


def source() -> str:
    """axe.min.js of the pinned release."""
    base = Path(os.environ.get("CONCIERGE_CACHE_DIR") or Path.home() / ".cache" / "concierge")
    cached = base / "axe-core" / f"axe-{VERSION}.min.js"
    if not cached.is_file():
        with urllib.request.urlopen(TARBALL, timeout=60) as response:  # noqa: S310 - a pinned registry URL
            data = response.read()
        algorithm, _, expected = INTEGRITY.partition("-")
        if base64.b64encode(hashlib.new(algorithm, data).digest()).decode() != expected:
            raise ValueError(f"{TARBALL} does not match its integrity hash")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            script = archive.extractfile("package/axe.min.js").read()
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.with_suffix(".partial").write_bytes(script)
        cached.with_suffix(".partial").rename(cached)
    return cached.read_text()


async def violations(page, impacts: tuple[str, ...] = SERIOUS) -> list[str]:
    """What axe finds on the page as it is now (WCAG 2.1 A and AA rules), of these impacts:
    one line each, the rule, its impact and the first elements it names."""
    if not await page.evaluate("() => typeof window.axe === 'object'"):
        await page.add_script_tag(content=source())
    found = await page.evaluate("""async () => (await axe.run(document, {
        runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})).violations
        .map((v) => ({id: v.id, impact: v.impact, targets: v.nodes.slice(0, 3).map((n) => n.target.join(' '))}))""")
    return [f"{v['id']} ({v['impact']}): {', '.join(v['targets'])}" for v in found if v["impact"] in impacts]
