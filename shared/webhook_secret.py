"""Each site's webhook secret (its lead and handoff webhooks), in the Standard Webhooks format
(`whsec_` + base64).

A site whose `[lead]` names `webhook_secret_env` uses that variable's secret (a Kubernetes
Secret, say): the customer's own key, rotated on its own. The variable's value is
`<site id>:whsec_…`, bound to its site like the enrichment and accounts keys: a config naming
another site's variable (or ADMIN_TOKEN, or one that is not set) gets no secret, and the
error is the same whichever it was, so a site key cannot learn what the responder's
environment holds. Any other site gets a key derived from the deployment secret
LEAD_WEBHOOK_SECRET and the site id (HMAC-SHA256 under a fixed label), so no two tenants share
one and none can be computed without the deployment secret. The responder signs with it;
`concierge sites webhook-secret` prints it for the customer. Both read the variables once, at
start, into `WebhookSecrets`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets

from shared.config import Settings, env_str
from shared.site_config import ENV_NAME_RE, Lead

PREFIX = "whsec_"
LABEL = b"concierge lead webhook v1|"
log = logging.getLogger(__name__)

MIN_BYTES = 24  # Standard Webhooks: secrets of 24 to 64 bytes
BOUND_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}:whsec_")  # a site's own variable: `<site id>:whsec_…`


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
    name (site configs change while the process runs), so every variable whose value is
    written as a site's secret (`<site id>:whsec_…`) is kept as the process started with it;
    no other variable is held."""

    SECRETS = ("deployment", "variables")
    deployment: str = ""
    variables: dict[str, str] = {}

    @classmethod
    def from_env(cls) -> "WebhookSecrets":
        for name, value in os.environ.items():
            if ENV_NAME_RE.match(name) and value.strip().startswith(PREFIX) and name != "LEAD_WEBHOOK_SECRET":
                # Written before secrets were bound to their site: such a site's webhooks stop.
                log.warning("a webhook secret not bound to a site is ignored: give it as <site id>:whsec_…",
                            extra={"variable": name})
        return cls(deployment=env_str("LEAD_WEBHOOK_SECRET", ""),
                   variables={name: value for name, value in os.environ.items()
                              if ENV_NAME_RE.match(name) and BOUND_RE.match(value.strip())})

    def for_site(self, site: str, lead: Lead) -> str:
        if lead.webhook_secret_env:
            bound, _, value = self.variables.get(lead.webhook_secret_env, "").strip().partition(":")
            if bound != site or not valid(value):
                raise WebhookSecretError(
                    f"no webhook secret for site {site} in the variable lead.webhook_secret_env names "
                    f"(its value: {site}:{PREFIX}… with base64 of at least {MIN_BYTES} bytes, "
                    f"from `concierge sites webhook-secret --new --site {site}`)")
            return value
        if not self.deployment:
            raise WebhookSecretError("LEAD_WEBHOOK_SECRET is not set and the site names no lead.webhook_secret_env")
        return derive(self.deployment, site)


def valid(value: str) -> bool:
    """Whether `value` is a Standard Webhooks secret of at least MIN_BYTES."""
    try:
        key = base64.b64decode(value.removeprefix(PREFIX), validate=True)
    except binascii.Error:
        return False
    return value.startswith(PREFIX) and len(key) >= MIN_BYTES


def bound(site: str, secret: str) -> str:
    """The value of a site's own variable: `secret` bound to `site`."""
    return f"{site}:{secret}"
