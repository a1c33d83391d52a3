"""Each site's webhook secret (its lead and handoff webhooks), in the Standard Webhooks format
(`whsec_` + base64).

A site whose `[lead]` names `webhook_secret_env` uses that variable's value (a Kubernetes
Secret, say): the customer's own key, rotated on its own. Any other site gets a key derived
from the deployment secret LEAD_WEBHOOK_SECRET and the site id (HMAC-SHA256 under a fixed
label), so no two tenants share one and none can be computed without the deployment secret.
The responder signs with it; `concierge sites webhook-secret` prints it for the customer.
Both read the variables once, at start, into `WebhookSecrets`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets

from shared.config import Settings, env_str
from shared.site_config import ENV_NAME_RE, Lead

PREFIX = "whsec_"
LABEL = b"concierge lead webhook v1|"
MIN_BYTES = 24  # Standard Webhooks: secrets of 24 to 64 bytes


class WebhookSecretError(ValueError):
    """No usable secret; the message names the variable, never its value."""


def derive(deployment_secret: str, site: str) -> str:
    key = hmac.new(deployment_secret.encode(), LABEL + site.encode(), hashlib.sha256).digest()
    return PREFIX + base64.b64encode(key).decode()


def new() -> str:
    """A fresh random secret, for a site's own variable."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


class WebhookSecrets(Settings):
    """LEAD_WEBHOOK_SECRET, and the variables a site's `lead.webhook_secret_env` may name: any
    name (site configs change while the process runs), so every variable with such a name is
    kept as the process started with it, as os.environ would have it."""

    SECRETS = ("deployment", "variables")
    deployment: str = ""
    variables: dict[str, str] = {}

    @classmethod
    def from_env(cls) -> "WebhookSecrets":
        return cls(deployment=env_str("LEAD_WEBHOOK_SECRET", ""),
                   variables={name: value for name, value in os.environ.items() if ENV_NAME_RE.match(name)})

    def for_site(self, site: str, lead: Lead) -> str:
        if lead.webhook_secret_env:
            name = lead.webhook_secret_env
            value = self.variables.get(name, "").strip()
            if not value:
                raise WebhookSecretError(f"{name} is not set (named by the site's lead.webhook_secret_env)")
            try:
                key = base64.b64decode(value.removeprefix(PREFIX), validate=True)
            except binascii.Error:
                key = b""
            if not value.startswith(PREFIX) or len(key) < MIN_BYTES:
                raise WebhookSecretError(f"{name} is not a Standard Webhooks secret "
                                         f"({PREFIX} + base64 of at least {MIN_BYTES} bytes)")
            return value
        if not self.deployment:
            raise WebhookSecretError("LEAD_WEBHOOK_SECRET is not set and the site names no lead.webhook_secret_env")
        return derive(self.deployment, site)
