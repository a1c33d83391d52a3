"""shared/company_size.py and shared/segments.py: employee ranges as providers write them,
which of a site's segments a visitor's profile matches, and what each field of the answer
takes from them."""

from __future__ import annotations

import pytest

from shared import company_size, segments
from shared.events import VisitorProfile
from shared.site_config import CTA, Segment, SiteConfig


@pytest.mark.parametrize("text,expected", [
    ("51-200", (51, 200)), ("1,001-5,000", (1001, 5000)), ("1000+", (1000, 10**9)), ("10001+", (10001, 10**9)),
    ("42", (42, 42)), ("11 – 50 employees", (11, 50)), ("11 to 50", (11, 50)),
    ("unknown", None), ("", None), ("lots", None), ("200-50", None),
    # What a browser or a provider may send: refused at once, whatever its length.
    ("1" + " " * 254 + "x", None), ("9" * 5000, None), ("1,2,3,4,5,6,7,8,9,10-20", None),
])
def test_employee_ranges_are_read_as_providers_write_them(text, expected):
    assert company_size.employees(text) == expected


CONFIG = SiteConfig(cta=CTA(label="Book a demo", booking_url="https://acme.example/book"), segments=[
    Segment(name="retail", sectors=["Retail", "E-commerce"], example="Shops use Acme for stock."),
    Segment(name="small-retail", sectors=["Retail"], employees="1-50", offer="Starter fits.",
            cta_label="Try Starter", cta_url="https://acme.example/starter"),
    Segment(name="small", employees="1-50", offer="Small plan fits.", tone="casual"),
    Segment(name="big", employees="1000+", offer="Enterprise fits.", cta_url="https://acme.example/enterprise"),
])


def test_each_field_comes_from_the_first_matching_segment_that_sets_it():
    shop = segments.for_visitor(CONFIG, VisitorProfile(sector="retail", company_size="11-50"))
    assert shop.segments == ("retail", "small-retail", "small")
    assert (shop.example, shop.offer, shop.tone) == ("Shops use Acme for stock.", "Starter fits.", "casual")
    assert shop.cta(CONFIG) == ("Try Starter", "https://acme.example/starter")
    # The sub-sector matches too; a segment with sectors and employees needs both.
    online = segments.for_visitor(CONFIG, VisitorProfile(sector="Consumer", sub_sector="E-commerce",
                                                         company_size="201-500"))
    assert online.segments == ("retail",) and online.offer == "" and online.cta(CONFIG) == (
        "Book a demo", "https://acme.example/book")
    # A link without a label keeps the site's label.
    assert segments.for_visitor(CONFIG, VisitorProfile(company_size="5001-10000")).cta(CONFIG) == (
        "Book a demo", "https://acme.example/enterprise")


def test_an_unknown_profile_matches_nothing():
    nobody = segments.for_visitor(CONFIG, VisitorProfile())
    assert nobody == segments.ForVisitor() and nobody.cta(CONFIG) == ("Book a demo", "https://acme.example/book")
    # A segment naming neither sectors nor employees would match everyone: it matches no one.
    assert not segments.matches(Segment(name="all"), VisitorProfile(sector="Retail", company_size="10"))
