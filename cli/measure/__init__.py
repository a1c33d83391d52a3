"""The measurements, one subpackage per family:

- bench/: `concierge bench` (the package itself; with critical_path.py, pprof_summary.py and
  alternate.py for `--against`), `llm-bench` (llm_bench.py) and `first-run` (first_run.py);
- loadtest/: `concierge loadtest` (the package itself), one module per service (gateway.py,
  router.py, ...), the rate driver (driver.py), the sweep (sweep.py) and the docs table and
  chart (report.py);
- rehearsal/: `concierge cluster-rehearsal` (cluster_rehearsal.py) and `concierge chaos`
  (chaos.py), on the one set-up, visitors and audit of cluster.py;
- evals/: `concierge eval` (the package itself), with answer_eval.py and brief_eval.py.

Here, what more than one family uses: every timing goes through stats.percentile, the
machine's speed is machine.py's gauge, a process's CPU time and RSS process_usage.py's.
"""
