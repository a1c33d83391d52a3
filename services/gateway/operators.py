"""Who may read a conversation's internals: operators, by bearer token.

- the deployment's operator token (ADMIN_TOKEN) sees every site;
- a site's API key (`ck_<site>_<secret>`, made by `concierge sites key`) sees only its
  site. The site's config holds the key's SHA-256, never the key; a key is checked
  against the hashes of the site named in it, so a valid key of another site is known
  as such (and that site's data answers 404, as if it did not exist);
- a named operator's key (the same form, `concierge sites key --operator NAME`; its hash in
  the site's `operators`) sees only its site too, and names its holder: what they do in a
  handoff is recorded under their name, whatever a request says (`Operator.name`).

The console signs in once with any of these and then sends its session cookie instead
(console_sessions.py): `from_session` checks the session's claims against today's config.

Comparisons are constant-time. No token or a wrong one: 401.
"""

from __future__ import annotations

import hmac

import msgspec

from services.gateway.console_sessions import Claims, admin_digest
from shared.config import invalid
from shared.site_config import SiteConfigs
from shared.site_store import KEY_PREFIX, key_sha256
from shared.subjects import TOKEN_RE

MIN_TOKEN_CHARS = 16


class Unauthorized(Exception):
    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class Operator(msgspec.Struct, frozen=True):
    site: str | None  # None: the deployment operator, every site
    key_hash: str = ""  # a site key's SHA-256 (empty: ADMIN_TOKEN)
    name: str = ""  # a named operator account's name (empty: a shared key or ADMIN_TOKEN)

    def sees(self, site: str) -> bool:
        return self.site is None or self.site == site

    @property
    def actor(self) -> str:
        """Who, in a site's audit log (`SiteChanged.actor`): never the key, a prefix of its
        hash, and a named account's name."""
        if self.site is None:
            return "admin"
        return f"key:{self.site}:{self.key_hash[:12]}" + (f":{self.name}" if self.name else "")


def site_of_key(key: str) -> str | None:
    """The site a per-site key names: `ck_<site>_<secret>` (the secret has no '_')."""
    if not key.startswith(KEY_PREFIX):
        return None
    site, sep, secret = key[len(KEY_PREFIX):].rpartition("_")
    return site if sep and secret and TOKEN_RE.match(site) else None


def check_admin_token(token: str) -> str:
    """ADMIN_TOKEN, refused when it is set and short: it guards every site's data."""
    if token and len(token) < MIN_TOKEN_CHARS:
        invalid(f"ADMIN_TOKEN must be at least {MIN_TOKEN_CHARS} characters (got {len(token)}): "
                "it guards every site's data", None)
    return token


class OperatorAuth:
    def __init__(self, configs: SiteConfigs, admin_token: str):
        """`admin_token`: ADMIN_TOKEN, from the gateway's settings; empty: site API keys only."""
        self.configs = configs
        self.admin_token = check_admin_token(admin_token)

    async def authenticate(self, authorization: str | None) -> Operator:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("operator endpoints need 'Authorization: Bearer <ADMIN_TOKEN or the site's API key>'")
        return await self.of_key(token)

    async def of_key(self, token: str) -> Operator:
        """The operator `token` is (ADMIN_TOKEN, a site's key, a named operator's key), or 401."""
        if self.admin_token and hmac.compare_digest(token.encode(), self.admin_token.encode()):
            return Operator(site=None)
        site = site_of_key(token)
        if site is not None and (found := await self._holder(site, key_sha256(token))) is not None:
            return found
        raise Unauthorized("the bearer token is not an operator token or a site API key")

    async def _holder(self, site: str, digest: str) -> Operator | None:
        """Who holds the site key whose SHA-256 is `digest`, by today's config of the site."""
        config = await self.configs.find(site)
        if config is None:
            return None
        if any(hmac.compare_digest(digest, known) for known in config.operator_key_sha256):
            return Operator(site=site, key_hash=digest)
        for account in config.operators:
            if hmac.compare_digest(digest, account.key_sha256):
                return Operator(site=site, key_hash=digest, name=account.name)
        return None

    def claims(self, who: Operator) -> Claims:
        """What a console session records of `who` (console_sessions.py)."""
        if who.site is None:
            return Claims(site=None, admin=admin_digest(self.admin_token))
        return Claims(site=who.site, key_hash=who.key_hash, name=who.name)

    async def from_session(self, claims: Claims) -> Operator:
        """The operator a console session is for, if what it signed in with still holds: the
        same ADMIN_TOKEN, or a site key still in the site's config. 401 otherwise."""
        if claims.site is None:
            if self.admin_token and hmac.compare_digest(claims.admin.encode(), admin_digest(self.admin_token).encode()):
                return Operator(site=None)
        elif (found := await self._holder(claims.site, claims.key_hash)) is not None and found.name == claims.name:
            return found
        raise Unauthorized("the console session is no longer valid (its key was revoked or replaced): sign in again")
