"""The paste-your-data demo's parser (services/gateway/account_paste.py): an account as JSON (both usage
forms, or `{"accounts": [one]}`) or as free text read by regex rules (the issue's two examples,
every field checked), its numbers and dates, its id (the same paste, the same id), the problems
it names, and the `pasted-` prefix an import may not use (shared/accounts.py). Pure functions."""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest

from services.gateway import account_paste
from shared import accounts

LABELLED = ("Acme Field Services\nTier: Growth\nARR: $48,000\nRenewal: 2027-02-15\nTechnician seats: 45 of 50\n"
            "Work orders: 8,200 / 10,000 per month\nIndustry: HVAC")
PROSE = ("Northwind Plumbing is on the Starter plan, $12k ARR, renews on 15 March 2027. They use 19 of 20 "
         "technician seats and 300 of 5,000 SMS credits. 35 employees, owner Dana Lee.")
EMPTY = {"domain": "", "tier": "", "arr": 0.0, "currency": "USD", "renewal_date": "", "owner": "", "industry": "",
         "employees": None, "notes": "", "usage": []}


def spec_id(fields: dict) -> str:
    """The id the issue specifies, computed here from the expected fields, not by the module."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return "pasted-" + hashlib.blake2b(canonical).hexdigest()[:12]


def fields_of(account: accounts.Account) -> dict:
    out = msgspec.to_builtins(account)
    out.pop("id")
    return out


def parsed(text: str, kind: str = "") -> accounts.Account:
    return account_paste.parse(text.encode(), kind)


def refused(data: str | bytes, kind: str = "") -> list[dict[str, str]]:
    with pytest.raises(accounts.AccountsError) as caught:
        account_paste.parse(data if isinstance(data, bytes) else data.encode(), kind)
    return caught.value.errors


# --- JSON --------------------------------------------------------------------------------------

LISTED = {"name": "Bluepeak Plumbing", "domain": "bluepeak.example", "tier": "Growth", "arr": 30000,
          "currency": "EUR", "renewal_date": "2027-01-31", "employees": 40,
          "usage": [{"metric": "technician_seats", "current": 14, "limit": 15, "unit": "seats"}]}


def test_json_an_account_with_usage_as_a_list():
    account = parsed(json.dumps(LISTED))
    expected = {**EMPTY, "name": "Bluepeak Plumbing", "domain": "bluepeak.example", "tier": "Growth",
                "arr": 30000.0, "currency": "EUR", "renewal_date": "2027-01-31", "employees": 40,
                "usage": [{"metric": "technician_seats", "current": 14.0, "limit": 15.0, "unit": "seats"}]}
    assert fields_of(account) == expected
    assert account.id == spec_id(expected)


def test_json_an_account_with_usage_as_a_mapping_of_objects_or_numbers():
    account = parsed(json.dumps({"name": "Bolt", "usage": {"seats": {"current": 9, "limit": 15, "unit": "seats"},
                                                           "logins_per_week": 31}}))
    assert [(m.metric, m.current, m.limit, m.unit) for m in account.usage] == [
        ("seats", 9.0, 15.0, "seats"), ("logins_per_week", 31.0, None, "")]


def test_json_accounts_with_exactly_one_is_the_same_account_and_its_id_given_is_replaced():
    alone = parsed(json.dumps(LISTED), "json")
    wrapped = parsed(json.dumps({"accounts": [{**LISTED, "id": "bluepeak"}]}))
    assert wrapped == alone and wrapped.id.startswith(account_paste.PASTED_PREFIX)
    assert parsed(json.dumps([LISTED])) == alone


def test_a_json_problem_names_the_field_of_the_account():
    assert refused(json.dumps({"name": "A", "usage": {"seats": {"current": 1, "limit": "x"}}})) == [
        {"field": "usage.seats.limit", "message": "Expected `float | null`, got `str`"}]
    assert refused('{"accounts": [{"name": "A", "arr": -5}]}') == [
        {"field": "accounts[0].arr", "message": "a yearly amount, 0 or more"}]


# --- free text ---------------------------------------------------------------------------------

def test_the_labelled_example_every_field():
    account = parsed(LABELLED)
    expected = {**EMPTY, "name": "Acme Field Services", "tier": "Growth", "arr": 48000.0, "currency": "USD",
                "renewal_date": "2027-02-15", "industry": "HVAC",
                "usage": [{"metric": "technician_seats", "current": 45.0, "limit": 50.0, "unit": "seats"},
                          {"metric": "work_orders", "current": 8200.0, "limit": 10000.0,
                           "unit": "orders per month"}]}
    assert fields_of(account) == expected
    assert account.id == spec_id(expected)


def test_the_prose_example_every_field():
    account = parsed(PROSE)
    expected = {**EMPTY, "name": "Northwind Plumbing", "tier": "Starter", "arr": 12000.0, "currency": "USD",
                "renewal_date": "2027-03-15", "owner": "Dana Lee", "employees": 35,
                "usage": [{"metric": "technician_seats", "current": 19.0, "limit": 20.0, "unit": "seats"},
                          {"metric": "sms_credits", "current": 300.0, "limit": 5000.0, "unit": "credits"}]}
    assert fields_of(account) == expected
    assert account.id == spec_id(expected)


def test_a_field_the_text_does_not_give_stays_empty():
    assert fields_of(parsed("Bolt Electric\n7 of 10 seats")) == {
        **EMPTY, "name": "Bolt Electric", "usage": [{"metric": "seats", "current": 7.0, "limit": 10.0, "unit": "seats"}]}


def test_labels_domain_owner_and_a_greeting_before_the_prose():
    text = ("Hi Sam,\nBolt Electric has 12 of 15 seats in the solar installation industry, ARR of €40k, "
            "managed by Kim Park. See www.bolt.example/about, deck.pdf and kim@vendor.example.")
    account = parsed(text)
    assert (account.name, account.domain, account.industry, account.owner, account.arr, account.currency) == (
        "Bolt Electric", "bolt.example", "solar installation", "Kim Park", 40000.0, "EUR")
    labelled = parsed("Customer: Bolt\nPlan: Pro\nARR: 1.5m GBP\nAccount manager: Sam Ortiz\nEmployees: 1,200\n"
                      "Website: https://bolt.example\nStorage: 40 / 100 GB")
    assert fields_of(labelled) == {**EMPTY, "name": "Bolt", "tier": "Pro", "arr": 1500000.0, "currency": "GBP",
                                   "owner": "Sam Ortiz", "employees": 1200, "domain": "bolt.example",
                                   "usage": [{"metric": "storage", "current": 40.0, "limit": 100.0, "unit": "GB"}]}


@pytest.mark.parametrize("line, arr, currency", [
    ("ARR: $48,000", 48000.0, "USD"),
    ("ARR: €12k", 12000.0, "EUR"),
    ("ARR: £1.25m", 1250000.0, "GBP"),
    ("ARR: 1,250,000.50 CHF", 1250000.5, "CHF"),
    ("ARR: SEK 480k", 480000.0, "SEK"),
    ("They pay $2.5K ARR", 2500.0, "USD"),
    ("ARR is 9,999 EUR", 9999.0, "EUR"),
])
def test_amounts_with_symbols_codes_thousands_and_suffixes(line, arr, currency):
    account = parsed(f"Acme\n{line}")
    assert (account.arr, account.currency) == (arr, currency)


def test_usage_figures_with_thousands_and_suffixes():
    account = parsed("Acme\n8.2k of 10k work orders and 1,500 / 2,000 API calls per day\nSeats: 1.5k of 2m")
    assert [(m.metric, m.current, m.limit, m.unit) for m in account.usage] == [
        ("seats", 1500.0, 2000000.0, "seats"), ("work_orders", 8200.0, 10000.0, "orders"),
        ("api_calls", 1500.0, 2000.0, "calls per day")]


@pytest.mark.parametrize("written", ["2027-03-15", "15 March 2027", "15th of March 2027", "15 Mar 2027",
                                     "March 15, 2027", "Mar. 15th, 2027", "15.03.2027",
                                     "15/03/2027", "15-03-2027", "03/15/2027", "2027/03/15"])
def test_renewal_dates_in_iso_european_and_american_forms(written):
    assert parsed(f"Acme\nARR: $1k\nRenewal: {written}").renewal_date == "2027-03-15"
    assert parsed(f"Acme has $1k ARR and renews on {written}.").renewal_date == "2027-03-15"


def test_the_same_paste_gives_the_same_id_and_another_figure_another():
    assert parsed(PROSE).id == parsed(PROSE).id == parsed(PROSE.replace(". ", ".\r\n")).id
    assert parsed(PROSE).id != parsed(PROSE.replace("19 of 20", "18 of 20")).id
    assert parsed(PROSE).id.startswith("pasted-") and len(parsed(PROSE).id) == len("pasted-") + 12


# --- problems ----------------------------------------------------------------------------------

NO_NAME = {"field": "name", "message": "no account name found: put it on the first line (Acme Field Services) "
                                       "or write 'Account: Acme Field Services'"}
NO_FIGURE = {"field": "figures", "message": "no figure found (ARR, usage or employees): e.g. 'ARR: $48,000', "
                                            "'Technician seats: 45 of 50' or '19 of 20 technician seats'"}


@pytest.mark.parametrize("data, kind, errors", [
    ("", "", [{"field": "text", "message": "empty: paste an account, e.g. Acme Field Services / ARR: $48,000 / "
                                           "Technician seats: 45 of 50"}]),
    (" \n\t", "text", [{"field": "text", "message": "empty: paste an account, e.g. Acme Field Services / "
                                                    "ARR: $48,000 / Technician seats: 45 of 50"}]),
    ("Tier: Growth\nARR: $48,000", "", [NO_NAME]),
    ("Acme Field Services\nTier: Growth\nIndustry: HVAC", "", [NO_FIGURE]),
    ("Tier: Growth", "", [NO_NAME, NO_FIGURE]),
    ("x" * 20_001, "text", [{"field": "text", "message": "longer than 20,000 characters (20,001): paste one account"}]),
    ("Acme\nARR: 48,000", "", [{"field": "currency", "message": "ARR 48,000: which currency? write $48,000, "
                                                                "€48,000, £48,000 or 48,000 EUR"}]),
    ("Acme\nARR: about 5k", "", [{"field": "arr", "message": "ARR: 'about 5k' is not an amount the rules read: "
                                                             "write $48,000, €12k or 48,000 EUR"}]),
    ("Acme\nARR: €48.000", "", [{"field": "arr", "message": "'48.000' is ambiguous (a thousands dot or decimals?): "
                                                            "write 48,000 or 48"}]),
    ("Acme\nARR: $1k\nRenewal: 03/04/2027", "", [{"field": "renewal_date", "message": "'03/04/2027' could be 3 "
                                                  "April or 4 March: write it as 2027-MM-DD or with the month's name"}]),
    ("Acme has $1k ARR, renews on 3.4.2027", "", [{"field": "renewal_date", "message": "'3.4.2027' could be 3 April "
                                               "or 4 March: write it as 2027-MM-DD or with the month's name"}]),
    ("Acme\nARR: $1k\nRenewal: 15/03/27", "", [{"field": "renewal_date", "message": "'15/03/27': write the year "
                                                "in full (2027-02-15 or 15 February 2027)"}]),
    ("Acme\nARR: $1k\nRenewal: 31 February 2027", "", [{"field": "renewal_date",
                                                        "message": "'31 February 2027' is not a calendar date"}]),
    ("Acme\nARR: $1k\nRenewal: next spring", "", [{"field": "renewal_date", "message": "Renewal: 'next spring' is "
                                                   "not a date the rules read: write 2027-02-15 or 15 February 2027"}]),
    ("Acme\nSeats: 4 of 5\nSeats: 3 of 5", "", [{"field": "usage[1].metric", "message": "'seats' is named twice"}]),
    ('{"accounts": [{"name": "A"}, {"name": "B"}]}', "",
     [{"field": "accounts", "message": "a paste is one account (2 accounts): give a list of one"}]),
    ('{"accounts": [{"name": "A"}], "deals": [{"account": "A", "outcome": "won"}]}', "",
     [{"field": "deals", "message": "a paste is one account: leave its deals out"}]),
    ('{"name": "A",', "json", [{"field": "line 1", "message": "not valid JSON: Expecting property name enclosed "
                                                              "in double quotes"}]),
    ("[Internal] Acme", "", [{"field": "line 1", "message": "not valid JSON: Expecting value (a free text that "
                                                            "starts with { or [: send it as kind \"text\")"}]),
    ('"Acme"', "json", [{"field": "json", "message": "an account object, or {\"accounts\": [one]}"}]),
    ("Acme\nARR: $1k", "yaml", [{"field": "kind", "message": "'yaml': give \"json\" or \"text\""}]),
])
def test_a_paste_refused_names_what_is_missing_or_wrong(data, kind, errors):
    assert refused(data, kind) == errors


def test_twenty_thousand_characters_are_read_and_a_free_text_starting_with_a_bracket_as_text():
    assert parsed("Acme\nARR: $1k\n" + " " * (20_000 - 14)).arr == 1000.0
    assert parsed("[Internal] Acme\nARR: $1k", "text").name == "[Internal] Acme"


# --- the reserved prefix -------------------------------------------------------------------------

def test_an_import_may_not_give_an_account_a_pasted_id():
    errors = [{"field": "accounts[0].id",
               "message": "ids starting with 'pasted-' are reserved for the paste-your-data demo: give another"}]
    with pytest.raises(accounts.AccountsError) as caught:
        accounts.parse(b'{"accounts": [{"id": "pasted-0123456789ab", "name": "Acme"}]}')
    assert caught.value.errors == errors
    with pytest.raises(accounts.AccountsError) as caught:
        accounts.parse(b"id,name\npasted-0123456789ab,Acme\n", "csv")
    assert caught.value.errors == [{**errors[0], "field": "line 2: id"}]


def test_an_id_derived_from_a_name_or_domain_never_takes_the_prefix():
    (media,) = accounts.parse(b'[{"name": "Pasted Media"}]').accounts
    assert media.id == "a-pasted-media"
    assert accounts.account_id("Pasted", "pasted-media.example") == "a-pasted-media-example"
    assert parsed("Pasted Media\nARR: $1k").name == "Pasted Media"
