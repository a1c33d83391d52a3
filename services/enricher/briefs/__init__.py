"""The lead-brief pipeline: a captured lead's markdown account brief, which a sales team
reads before calling the lead, and the site's triage of its open leads."""
