"""Session tokens: a conversation belongs to whoever holds the token issued on its first turn.

    token = "v1." + key_id + "." + base64url(HMAC-SHA256(secret, "concierge-session\\n" + site + "\\n" + session_id))

Nothing is stored: any gateway replica that has the secret verifies a token. The secret
has a key id so it can be rotated without logging every visitor out: the current key
(SESSION_TOKEN_SECRET, SESSION_TOKEN_KEY_ID) signs, earlier ones listed in
SESSION_TOKEN_PREVIOUS ("kid:secret,kid:secret") still verify, and every `complete`
event hands the visitor a token under the current key, so tokens roll forward by use.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets

from shared.config import invalid

log = logging.getLogger(__name__)

VERSION = "v1"
_KID_RE = re.compile(r"^[A-Za-z0-9_-]{1,16}\Z")
MIN_SECRET_CHARS = 16


class SessionTokens:
    def __init__(self, secret: str, key_id: str = "1", previous: dict[str, str] | None = None):
        keys = {key_id: secret, **{k: v for k, v in (previous or {}).items() if k != key_id}}
        for kid, value in keys.items():
            if not _KID_RE.match(kid):
                invalid(f"SESSION_TOKEN_KEY_ID / SESSION_TOKEN_PREVIOUS: key id {kid!r} must be letters, digits, "
                        "'-' or '_', 1-16", None)
            if len(value) < MIN_SECRET_CHARS:
                invalid(f"SESSION_TOKEN_SECRET / SESSION_TOKEN_PREVIOUS: the secret of key {kid!r} must be at least "
                        f"{MIN_SECRET_CHARS} characters (got {len(value)})", None)
        self.key_id = key_id
        self._keys = {kid: value.encode() for kid, value in keys.items()}

    @classmethod
    def configured(cls, secret: str, key_id: str, previous: dict[str, str]) -> "SessionTokens":
        """The gateway's tokens from its settings (SESSION_TOKEN_*)."""
        if not secret:
            # Tokens still protect conversations, but only this process can check them:
            # another replica or a restart would refuse every visitor's token.
            log.warning("SESSION_TOKEN_SECRET is not set: session tokens are valid in this process only")
            secret = secrets.token_urlsafe(32)
        return cls(secret, key_id, previous)

    def issue(self, site: str, session_id: str) -> str:
        return f"{VERSION}.{self.key_id}.{self._mac(self._keys[self.key_id], site, session_id)}"

    def verify(self, site: str, session_id: str, token: str | None) -> bool:
        if not token:
            return False
        version, _, rest = token.partition(".")
        kid, _, mac = rest.partition(".")
        key = self._keys.get(kid)
        if version != VERSION or key is None:
            return False
        return hmac.compare_digest(mac.encode(), self._mac(key, site, session_id).encode())

    @staticmethod
    def _mac(key: bytes, site: str, session_id: str) -> str:
        digest = hmac.new(key, f"concierge-session\n{site}\n{session_id}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
