"""The measurements: `concierge bench`, `loadtest`, `eval`, `first-run` and `llm-bench`.

Every timing goes through stats.percentile; every single-service load test arrives through
driver.open_loop and reports through sweep.py.
"""
