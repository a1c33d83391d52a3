"""A site's accounts and deals (shared/accounts.py): the files (JSON with both usage formats,
CSV of accounts and of deals), their problems named by field or line, the store's idempotent
upsert and its audit, `concierge accounts`, the operator API (services/gateway/routes/accounts.py)
with another site's key, and the pull connector against a local HTTP server (its cache's TTL,
private addresses refused by default). Real NATS; the gateway in process."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import msgspec
import pytest

from cli import accounts as accounts_cli
from cli.harness.supervisor import DEMO_ACCOUNTS
from shared import accounts
from shared.site_config import Accounts as PullSettings
from shared.site_config import SiteConfigError, validate
from shared.web import Outbound, WebClient
from tests.helpers import unique
from tests.servers import configure_site
from tests.test_turn_end import running_gateway

ADMIN = "accounts-api-admin-token-0123456789"

LIST_FORMAT = {"accounts": [{
    "name": "Acme Heating", "domain": "acme-heating.example", "tier": "Growth", "arr": 48000, "currency": "USD",
    "renewal_date": "2027-03-31", "owner": "Dana", "industry": "HVAC", "employees": 80,
    "usage": [{"metric": "technician_seats", "current": 58, "limit": 60, "unit": "seats"},
              {"metric": "work_orders_per_month", "current": 4200, "limit": 10000, "unit": "work orders"}]}],
    "deals": [{"account": "Bolt Electric", "tier": "Growth", "outcome": "expanded", "value": 22000,
               "date": "2025-06-01", "summary": "Added 20 seats.", "lessons": "Near the limit: upsell."}]}
MAPPING_FORMAT = [{"id": "bluepeak", "name": "Bluepeak Plumbing", "arr": 12000,
                   "usage": {"technician_seats": {"current": 9, "limit": 15, "unit": "seats"}, "logins_per_week": 31}}]
ACCOUNTS_CSV = """id,name,tier,arr,renewal_date,usage:technician_seats,usage:technician_seats:limit,usage:technician_seats:unit,usage:storage
voltline,Voltline Electrical,Growth,"62,500",2027-01-15,118,120,seats,3.5
sunfield,Sunfield Solar,Starter,14400,2026-12-15,5,15,seats,
"""
DEALS_CSV = """account,tier,outcome,value,date,summary
Radiant Solar,Starter,churned,9000,2024-03-02,Nobody owned the rollout.
Summit Elevator,Enterprise,won,180000,2025-09-10,Pilot on real jobs.
"""


def key_of(site: str) -> str:
    return f"ck_{site}_{hashlib.sha256(site.encode()).hexdigest()[:24]}"


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def metrics(account: accounts.Account) -> dict:
    return {m.metric: (m.current, m.limit, m.unit) for m in account.usage}


# --- the files ---------------------------------------------------------------------------------

def test_json_takes_usage_as_a_list_of_metrics_or_as_a_mapping():
    listed = accounts.parse(json.dumps(LIST_FORMAT).encode())
    (acme,) = listed.accounts
    assert acme.id == "acme-heating-example" and acme.arr == 48000.0 and acme.employees == 80
    assert metrics(acme) == {"technician_seats": (58.0, 60.0, "seats"),
                             "work_orders_per_month": (4200.0, 10000.0, "work orders")}
    (deal,) = listed.deals
    assert deal.outcome == "expanded" and deal.id.startswith("d-") and deal.value == 22000.0
    (bluepeak,) = accounts.parse(json.dumps(MAPPING_FORMAT).encode()).accounts  # a list of accounts, mapped usage
    assert metrics(bluepeak) == {"technician_seats": (9.0, 15.0, "seats"), "logins_per_week": (31.0, None, "")}


def test_csv_of_accounts_with_metric_columns_and_csv_of_deals():
    found = accounts.parse(ACCOUNTS_CSV.encode(), "csv").accounts
    assert [a.id for a in found] == ["voltline", "sunfield"]
    assert found[0].arr == 62500.0 and found[0].renewal_date == "2027-01-15"
    assert metrics(found[0]) == {"technician_seats": (118.0, 120.0, "seats"), "storage": (3.5, None, "")}
    assert metrics(found[1]) == {"technician_seats": (5.0, 15.0, "seats")}  # an empty cell: no metric
    deals = accounts.parse(DEALS_CSV.encode()).deals  # sniffed: not JSON
    assert [(d.account, d.outcome, d.value) for d in deals] == [("Radiant Solar", "churned", 9000.0),
                                                                ("Summit Elevator", "won", 180000.0)]


def test_ids_derive_from_what_they_name_so_a_file_and_its_csv_twin_agree():
    once, again = (accounts.parse(json.dumps(LIST_FORMAT).encode()) for _ in range(2))
    assert once == again
    as_csv = accounts.parse(b"account,tier,outcome,value,date,summary,lessons\n"
                            b"Bolt Electric,Growth,expanded,22000.0,2025-06-01,Added 20 seats.,Near the limit: upsell.\n")
    assert as_csv.deals[0].id == once.deals[0].id


@pytest.mark.parametrize("data, field, says", [
    ({"accounts": [{"name": "A", "arr": "lots"}]}, "accounts[0].arr", "Expected `float`"),
    ({"accounts": [{"name": "A", "renewal_date": "2027-13-01"}]}, "accounts[0].renewal_date", "not a date"),
    ({"accounts": [{"name": "A", "usage": [{"metric": "seats"}]}]}, "accounts[0].usage[0].current", "missing"),
    ({"accounts": [{"name": "A", "usage": {"logins": 3, "seats": {"current": 1, "limit": "x"}}}]},
     "accounts[0].usage.seats.limit", "Expected"),
    ({"accounts": [{"name": "A", "usage": {"seats": 1e20}}]}, "accounts[0].usage.seats.current", "finite"),
    ({"accounts": [{"name": "A", "id": "has space"}]}, "accounts[0].id", "letters, digits"),
    ({"accounts": [{"name": "A"}, {"name": "A"}]}, "accounts[1].id", "also the id"),
    ({"accounts": [{"name": "A", "currency": "dollars"}]}, "accounts[0].currency", "three-letter"),
    ({"accounts": [{"name": "A", "notes": "x" * 5000}]}, "accounts[0].notes", "at most"),
    ({"deals": [{"account": "B", "outcome": "maybe"}]}, "deals[0].outcome", "Invalid enum value"),
    ({"deals": [{"outcome": "won"}]}, "deals[0].account", "missing required field"),
    ({"accounts": [{"name": "A"}], "leads": []}, "leads", "unknown key"),
    ({"accounts": {"name": "A"}}, "accounts", "must be a list"),
])
def test_a_problem_names_its_field(data, field, says):
    with pytest.raises(accounts.AccountsError) as refused:
        accounts.parse(json.dumps(data).encode())
    assert any(e["field"] == field and says in e["message"] for e in refused.value.errors), refused.value.errors


def test_a_csv_problem_names_its_line_and_column_and_every_problem_is_listed():
    text = ACCOUNTS_CSV + "brightwire,Brightwire,Starter,12k,2026-02-30,3,5,seats,\n"
    with pytest.raises(accounts.AccountsError) as refused:
        accounts.parse(text.encode(), "csv")
    assert {(e["field"]) for e in refused.value.errors} == {"line 4: arr", "line 4: renewal_date"}
    with pytest.raises(accounts.AccountsError) as refused:
        accounts.parse(b"name,revenue\nAcme,1\n", "csv")
    assert refused.value.errors[0]["field"] == "line 1: revenue" and "unknown column" in refused.value.errors[0]["message"]
    with pytest.raises(accounts.AccountsError) as refused:
        accounts.parse(b'{"accounts": [', "json")
    assert refused.value.errors[0]["field"] == "line 1" and "not valid JSON" in refused.value.errors[0]["message"]


def test_the_sample_portfolio_is_twenty_accounts_and_forty_deals():
    portfolio = accounts.parse(DEMO_ACCOUNTS.read_bytes())
    assert len(portfolio.accounts) == 20 and len(portfolio.deals) == 40
    assert all(a.usage and a.renewal_date and a.arr > 0 for a in portfolio.accounts)
    assert {d.outcome for d in portfolio.deals} == set(accounts.OUTCOMES)


def test_the_pull_connector_settings_are_checked():
    config = validate({"accounts": {"pull_url": "https://crm.example/accounts", "pull_key_env": "ACCOUNTS_KEY_ACME",
                                    "pull_ttl_s": 600}})
    assert config.accounts.pull_ttl_s == 600
    with pytest.raises(SiteConfigError) as refused:
        validate({"accounts": {"pull_url": "ftp://crm.example", "pull_key_env": "LLM_API_KEY", "pull_ttl_s": 1}})
    assert {e.field for e in refused.value.errors} == {"accounts.pull_url", "accounts.pull_key_env",
                                                       "accounts.pull_ttl_s"}


# --- the store ---------------------------------------------------------------------------------

async def test_an_import_stores_what_changed_audits_it_and_the_same_file_again_changes_nothing(bus, site):
    portfolio = accounts.parse(json.dumps(LIST_FORMAT).encode())
    first = await accounts.store(bus, site, portfolio, "cli:test", "cli")
    assert first.added == {"accounts": 1, "deals": 1} and first.changed == {"accounts": 0, "deals": 0}
    assert await accounts.store(bus, site, portfolio, "cli:test", "cli") is None
    assert accounts.counts_of(portfolio, None)["unchanged"] == {"accounts": 1, "deals": 1}

    changed = msgspec.structs.replace(portfolio.accounts[0], arr=50000.0)
    again = await accounts.store(bus, site, accounts.Portfolio(accounts=[changed], deals=portfolio.deals), "api", "api")
    assert again.changed == {"accounts": 1, "deals": 0} and again.unchanged == {"accounts": 0, "deals": 1}
    assert (await accounts.account(bus, site, changed.id)).arr == 50000.0
    audited = await accounts.imports(bus, site)
    assert [(e.actor, e.source) for e in audited] == [("cli:test", "cli"), ("api", "api")]
    assert audited[0].session_id == accounts.ACCOUNTS_SESSION


async def test_a_sites_records_are_read_under_its_own_keys_only(bus, site):
    other = unique("other")
    await accounts.store(bus, site, accounts.parse(ACCOUNTS_CSV.encode()), "cli", "cli")
    await accounts.store(bus, other, accounts.parse(json.dumps(MAPPING_FORMAT).encode()), "cli", "cli")
    assert [a.id for a in await accounts.accounts(bus, site)] == ["sunfield", "voltline"]
    assert [a.id for a in await accounts.accounts(bus, other)] == ["bluepeak"]
    assert await accounts.account(bus, other, "voltline") is None


# --- the CLI -----------------------------------------------------------------------------------

def test_the_cli_imports_lists_and_refuses_bad_input_with_exit_2(nats_url, tmp_path, capsys):
    site = unique("cli")
    path = tmp_path / "accounts.csv"
    path.write_text(ACCOUNTS_CSV)
    assert accounts_cli.main(["--nats-url", nats_url, "import", "--site", site, str(path)]) == 0
    assert "added 2 accounts and 0 deals" in capsys.readouterr().out
    assert accounts_cli.main(["--nats-url", nats_url, "import", "--site", site, str(path)]) == 0
    assert "added 0 accounts and 0 deals, changed 0 accounts and 0 deals, unchanged 2 accounts" in capsys.readouterr().out

    assert accounts_cli.main(["--nats-url", nats_url, "list", "--site", site]) == 0
    out = capsys.readouterr().out
    assert "Voltline Electrical" in out and "technician_seats" in out and "2 accounts, 0 deals" in out
    assert accounts_cli.main(["--nats-url", nats_url, "list", "--site", site, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {a["id"] for a in listed["accounts"]} == {"voltline", "sunfield"}

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"accounts": [{"name": "A", "arr": -5}]}))
    assert accounts_cli.main(["--nats-url", nats_url, "import", "--site", site, str(bad)]) == 2
    assert "accounts[0].arr" in capsys.readouterr().err
    assert accounts_cli.main(["--nats-url", nats_url, "import", "--site", site, str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err
    assert "none.csv" in err and "Traceback" not in err


# --- the operator API --------------------------------------------------------------------------

class CRM:
    """An account endpoint on 127.0.0.1: the import's JSON for the right bearer key, 401 for
    another; `hits` counts the requests."""

    KEY = "crm-key-0123"

    def __init__(self):
        self.hits = 0
        self.body = json.dumps(LIST_FORMAT).encode()
        crm = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                crm.hits += 1
                ok = self.headers.get("Authorization") == f"Bearer {crm.KEY}"
                body = crm.body if ok else b"{}"
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/accounts.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def crm():
    server = CRM()
    yield server
    server.close()


@pytest.fixture
async def api(nats_url, redis_url, site, monkeypatch, crm, request):
    """The gateway (private addresses allowed when the test asks with a parameter), the site with
    its key, another site with its own, and a third whose accounts come from `crm`."""
    other, pulled = unique("other"), unique("pulled")
    for name in (site, other, pulled):
        extra = {"accounts": PullSettings(pull_url=crm.url, pull_key_env="ACCOUNTS_KEY_CRM", pull_ttl_s=600)} \
            if name == pulled else {}
        await configure_site(nats_url, name, operator_key_sha256=[hashlib.sha256(key_of(name).encode()).hexdigest()],
                             **extra)
    allow = getattr(request, "param", False)  # parametrized indirectly: OUTBOUND_ALLOW_PRIVATE_NETWORKS
    async with running_gateway(nats_url, redis_url, monkeypatch, admin_token=ADMIN, outbound=Outbound(allow_private=allow),
                               account_keys={"ACCOUNTS_KEY_CRM": f"{pulled}:{CRM.KEY}"}) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, other, pulled


async def test_the_api_imports_json_and_csv_and_reads_them_back(site, api):
    client, _, _ = api
    base = f"/v1/admin/sites/{site}"
    first = await client.post(f"{base}/accounts/import", json=LIST_FORMAT, headers=bearer(key_of(site)))
    assert first.status_code == 200, first.text
    assert first.json()["added"] == {"accounts": 1, "deals": 1}
    again = await client.post(f"{base}/accounts/import", json=LIST_FORMAT, headers=bearer(key_of(site)))
    assert again.json()["added"] == {"accounts": 0, "deals": 0} and again.json()["unchanged"] == {"accounts": 1,
                                                                                                "deals": 1}
    as_csv = await client.post(f"{base}/accounts/import", content=ACCOUNTS_CSV,
                               headers={**bearer(ADMIN), "Content-Type": "text/csv"})
    assert as_csv.status_code == 200 and as_csv.json()["added"] == {"accounts": 2, "deals": 0}

    listed = (await client.get(f"{base}/accounts", headers=bearer(key_of(site)))).json()
    rows = {r["id"]: r for r in listed["accounts"]}
    assert set(rows) == {"acme-heating-example", "voltline", "sunfield"} and listed["pull"] is None
    assert rows["voltline"]["near_limit"] == ["technician_seats"] and rows["sunfield"]["near_limit"] == []
    one = (await client.get(f"{base}/accounts/voltline", headers=bearer(key_of(site)))).json()["account"]
    assert one["usage"][0] == {"metric": "technician_seats", "current": 118.0, "limit": 120.0, "unit": "seats"}
    assert (await client.get(f"{base}/accounts/nobody", headers=bearer(ADMIN))).status_code == 404
    deals = (await client.get(f"{base}/deals", params={"outcome": "expanded"}, headers=bearer(ADMIN))).json()["deals"]
    assert [d["account"] for d in deals] == ["Bolt Electric"]
    assert (await client.get(f"{base}/deals", params={"outcome": "lost"}, headers=bearer(ADMIN))).json()["deals"] == []


async def test_bad_input_is_a_422_naming_the_field_and_stores_nothing(site, api):
    client, _, _ = api
    base = f"/v1/admin/sites/{site}"
    bad = await client.post(f"{base}/accounts/import", json={"accounts": [{"name": "A", "renewal_date": "soon"}]},
                            headers=bearer(ADMIN))
    assert bad.status_code == 422
    assert bad.json()["errors"] == [{"field": "accounts[0].renewal_date", "message": "'soon' is not a date YYYY-MM-DD"}]
    csv_bad = await client.post(f"{base}/accounts/import", content="name,arr\nA,12k\n",
                                headers={**bearer(ADMIN), "Content-Type": "text/csv"})
    assert csv_bad.status_code == 422 and csv_bad.json()["errors"][0]["field"] == "line 2: arr"
    for body in (b"\xff\xfe", b"[[[[", b"42"):
        answer = await client.post(f"{base}/accounts/import", content=body, headers=bearer(ADMIN))
        assert answer.status_code == 422, (body, answer.text)
    assert (await client.get(f"{base}/accounts", headers=bearer(ADMIN))).json()["accounts"] == []


async def test_another_sites_key_sees_nothing_of_the_sites_accounts(site, api):
    client, other, _ = api
    base = f"/v1/admin/sites/{site}"
    assert (await client.post(f"{base}/accounts/import", json=LIST_FORMAT, headers=bearer(key_of(site)))).status_code == 200
    for method, path in (("GET", "/accounts"), ("GET", "/accounts/acme-heating-example"), ("GET", "/deals"),
                         ("POST", "/accounts/import"), ("POST", "/accounts/pull")):
        answer = await client.request(method, base + path, headers=bearer(key_of(other)),
                                      json=LIST_FORMAT if path.endswith("import") else None)
        assert answer.status_code == 404, (method, path, answer.text)
        assert "Acme" not in answer.text
        assert (await client.request(method, base + path)).status_code == 401
    assert (await client.get(f"/v1/admin/sites/{other}/accounts", headers=bearer(key_of(other)))).json()["accounts"] == []


@pytest.mark.parametrize("api", [True], indirect=True)
async def test_the_pull_connector_fetches_once_per_ttl_and_on_demand(api, crm):
    client, _, pulled = api
    base = f"/v1/admin/sites/{pulled}"
    first = (await client.get(f"{base}/accounts", headers=bearer(key_of(pulled)))).json()
    assert first["pull"]["fetched"] is True and first["pull"]["counts"]["added"] == {"accounts": 1, "deals": 1}
    assert [a["id"] for a in first["accounts"]] == ["acme-heating-example"] and crm.hits == 1
    cached = (await client.get(f"{base}/accounts", headers=bearer(key_of(pulled)))).json()
    assert cached["pull"]["fetched"] is False and crm.hits == 1  # within pull_ttl_s: the stored records
    forced = await client.post(f"{base}/accounts/pull", headers=bearer(key_of(pulled)))
    assert forced.status_code == 200 and crm.hits == 2
    assert forced.json()["pull"]["counts"]["unchanged"] == {"accounts": 1, "deals": 1}
    assert (await client.post(f"/v1/admin/sites/{pulled}-none/accounts/pull", headers=bearer(ADMIN))).status_code == 404


async def test_the_pull_connector_refuses_a_loopback_address_by_default(api, crm):
    client, _, pulled = api
    base = f"/v1/admin/sites/{pulled}"
    listed = (await client.get(f"{base}/accounts", headers=bearer(ADMIN))).json()
    assert "loopback" in listed["pull"]["error"] and listed["accounts"] == [] and crm.hits == 0
    forced = await client.post(f"{base}/accounts/pull", headers=bearer(ADMIN))
    assert forced.status_code == 502 and "OUTBOUND_ALLOW_PRIVATE_NETWORKS" in forced.json()["detail"] and crm.hits == 0


async def test_the_cache_honours_the_ttl_and_a_failed_fetch_keeps_what_was_stored(bus, site, crm):
    settings = PullSettings(pull_url=crm.url, pull_key_env="ACCOUNTS_KEY_CRM", pull_ttl_s=60)
    keys = {"ACCOUNTS_KEY_CRM": f"{site}:{CRM.KEY}"}
    client = WebClient(accounts.USER_AGENT, Outbound(allow_private=True))
    try:
        t0 = 1_900_000_000.0
        assert (await accounts.pull(bus, site, settings, client, keys, now=t0)).fetched and crm.hits == 1
        assert not (await accounts.pull(bus, site, settings, client, keys, now=t0 + 59)).fetched and crm.hits == 1
        assert (await accounts.pull(bus, site, settings, client, keys, now=t0 + 60)).fetched and crm.hits == 2
        crm.body = json.dumps({"accounts": [{"name": "Broken", "arr": "n/a"}]}).encode()
        with pytest.raises(accounts.PullError) as failed:
            await accounts.pull(bus, site, settings, client, keys, now=t0 + 120)
        assert failed.value.errors[0]["field"] == "accounts[0].arr"
        assert [a.name for a in await accounts.accounts(bus, site)] == ["Acme Heating"]
        with pytest.raises(accounts.PullError, match="401"):
            await accounts.pull(bus, site, settings, client, {"ACCOUNTS_KEY_CRM": f"{site}:wrong"}, force=True)
        hits = crm.hits
        with pytest.raises(accounts.PullError, match="no key for this site"):
            await accounts.pull(bus, site, settings, client, {}, force=True)
        # Another site's key, its variable named in this site's config: not sent anywhere.
        with pytest.raises(accounts.PullError, match="no key for this site"):
            await accounts.pull(bus, site, settings, client, {"ACCOUNTS_KEY_CRM": f"other:{CRM.KEY}"}, force=True)
        assert crm.hits == hits
        assert (await accounts.last_pull(bus, site)).error
    finally:
        await client.close()


async def test_the_sample_portfolio_imports_cleanly_and_again_changes_nothing(bus, site):
    portfolio = accounts.parse(Path(DEMO_ACCOUNTS).read_bytes())
    first = await accounts.store(bus, site, portfolio, "cli", "sample")
    assert first.added == {"accounts": 20, "deals": 40}
    assert await accounts.store(bus, site, portfolio, "cli", "sample") is None
    assert len(await accounts.accounts(bus, site)) == 20 and len(await accounts.deals(bus, site)) == 40
