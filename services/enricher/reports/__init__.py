"""The account-report pipeline: an existing customer's consulting-style report (nine
sections, a validated metadata line, a sales script) for its account manager."""
