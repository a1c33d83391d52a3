"""Each site's lead-webhook secret, in the Standard Webhooks format (`whsec_` + base64).

A site whose `[lead]` names `webhook_secret_env` uses that variable's value (a Kubernetes
Secret, say): the customer's own key, rotated on its own. Any other site gets a key derived
from the deployment secret LEAD_WEBHOOK_SECRET and the site id (HMAC-SHA256 under a fixed
label), so no two tenants share one and none can be computed without the deployment secret.
The responder signs with it; `concierge sites webhook-secret` prints it for the customer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from shared.config import env_str
from shared.site_config import Lead

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


def for_site(site: str, lead: Lead) -> str:
    if lead.webhook_secret_env:
        name = lead.webhook_secret_env
        value = env_str(name, "").strip()
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
    deployment = env_str("LEAD_WEBHOOK_SECRET", "")
    if not deployment:
        raise WebhookSecretError("LEAD_WEBHOOK_SECRET is not set and the site names no lead.webhook_secret_env")
    return derive(deployment, site)
