"""The operator console's sign-in: a key typed once, a signed session cookie after.

`POST /v1/admin/session {"key": …}` (routes/console.py) checks the key as a bearer token is
checked (operators.py: ADMIN_TOKEN, a site's API key, a named operator's key) and answers
with the cookie `concierge_console`: HttpOnly (no script reads it), SameSite=Strict (no
other site's page makes the browser send it), Path=/v1/admin, Secure when the request came
over HTTPS (directly, or per the ingress's X-Forwarded-Proto), for CONSOLE_SESSION_S. Its
value is signed (itsdangerous, with keys derived from SESSION_TOKEN_SECRET and the previous
secrets, so a rotation keeps sessions) and names who signed in, never the key: the
deployment's operator (with a digest of ADMIN_TOKEN), or a site with the key's SHA-256 (and
a named operator's name). Every request re-checks that against the site's config
(`OperatorAuth.from_session`): a key revoked, or ADMIN_TOKEN changed, ends its sessions as
it ends its bearer's (within the config cache's SITE_CONFIG_TTL_S). A request carrying the cookie must also carry `X-Concierge-Console: 1`, which no
cross-site form, link or image can send: a second guard behind SameSite.
"""

from __future__ import annotations

import hashlib
import logging
import secrets

import msgspec
from itsdangerous import BadSignature, URLSafeTimedSerializer

log = logging.getLogger(__name__)

COOKIE = "concierge_console"
HEADER = "X-Concierge-Console"
PATH = "/v1/admin"
SALT = "concierge-console-session"


class Claims(msgspec.Struct, frozen=True):
    """Who a session is for: `site` None is the deployment's operator (`admin`: a digest of
    the ADMIN_TOKEN it signed in with); else a site, its key's SHA-256 and a named
    operator's name."""

    site: str | None
    key_hash: str = ""
    name: str = ""
    admin: str = ""


def admin_digest(token: str) -> str:
    """What a session keeps of ADMIN_TOKEN: enough to notice it changed, nothing to use."""
    return hashlib.sha256(b"console:" + token.encode()).hexdigest()[:32]


class ConsoleSessions:
    def __init__(self, secret: str, previous: list[str] | None = None, ttl_s: int = 8 * 3600):
        if not secret:
            # Sessions still work, but only this process can read them: another replica or a
            # restart asks the operator to sign in again.
            log.warning("SESSION_TOKEN_SECRET is not set: console sessions are valid in this process only")
            secret = secrets.token_urlsafe(32)
        # itsdangerous signs with the last key and accepts any of them.
        self._signer = URLSafeTimedSerializer([*(previous or []), secret], salt=SALT)
        self.ttl_s = ttl_s

    def issue(self, claims: Claims) -> str:
        return self._signer.dumps(msgspec.to_builtins(claims))

    def read(self, value: str) -> Claims | None:
        """The claims of a cookie signed here and not older than the session's life; None
        for anything else (tampered, expired, another deployment's, not one at all)."""
        try:
            return msgspec.convert(self._signer.loads(value, max_age=self.ttl_s), Claims)
        except (BadSignature, msgspec.ValidationError, TypeError, ValueError):
            return None
