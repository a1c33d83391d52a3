"""Prompts as files, in three levels:

1. the meta-template (`shared/prompts/meta.md`): who the assistant is and the rules that
   hold for every task and every site;
2. the agent template of one node (e.g. `services/router/prompts/intent_classifier.md`):
   the task;
3. the client instructions of the site (`instructions` in `sites/<site>.toml`).

`compose` fills the meta-template with the other two. Templates use `$name`
placeholders (`string.Template`), so JSON examples with braces need no escaping.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from string import Template

from shared.site_config import SiteConfig

META = Path(__file__).parent / "prompts" / "meta.md"
NO_CLIENT_INSTRUCTIONS = "(none)"


# Templates to use instead of the shipped ones, by file name (`concierge replay fork
# --prompts-dir`: what an answer would be with a changed prompt).
_overrides: dict[str, Path] = {}


def override(directory: Path) -> list[str]:
    """Use the `.md` files of `directory` in place of the shipped templates of the same name;
    the names overridden."""
    _overrides.update({p.name: p for p in sorted(directory.glob("*.md"))})
    _template.cache_clear()
    return sorted(_overrides)


@lru_cache(maxsize=64)
def _template(path: str) -> Template:
    chosen = _overrides.get(Path(path).name, Path(path))
    return Template(Path(chosen).read_text(encoding="utf-8"))


def compose(agent: Path | str, site: str, config: SiteConfig, **values: str) -> str:
    """The system prompt for one node on one site. `values` fill `$placeholders` of the
    agent template (and may use the site's name as `$site_name`)."""
    site_name = config.name or site
    filled_agent = _template(str(agent)).safe_substitute(site_name=site_name, **values).strip()
    client = config.instructions.strip() or NO_CLIENT_INSTRUCTIONS
    return _template(str(META)).safe_substitute(site_name=site_name, agent=filled_agent, client=client).strip()
