"""The measurements: `concierge bench`, `loadtest`, `eval`, `first-run` and `llm-bench`.

Every timing goes through stats.percentile; every single-service load test publishes
through driver.drive.
"""
