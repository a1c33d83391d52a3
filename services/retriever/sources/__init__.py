"""Knowledge sources kept in sync: a site's website, uploaded files and text snippets
become its knowledge base, and stay current (shared/sources.py defines sources and asks for
runs; this package runs them).

One run of a source (turn N of its log, session `_src-<id>`):

    SyncRequested ─ sync_planner ─→ SyncStarted (robots.txt, the sitemap's pages or the start page)
                                 └→ PageFetchRequested × pages      (BRIEFS work queue)
    PageFetchRequested ─ page_fetcher ─→ PageFetched (text staged)  (any replica, each page once)
    PageFetched ─ sync_collector ─→ PageFetchRequested × new links  (a discovering run)
                                └→ at the run's last page: the knowledge base changed → SyncCompleted

The run's progress is folded from its log (shared/state.py `SyncProgress`): every reader
agrees which pages the run has and when it is complete. Nothing in the knowledge base
changes until every page has its outcome, so a crash or a failure mid-run leaves what
served before serving; the end (changed pages ingested, pages gone removed) is idempotent,
so a redelivered end does it again to the same result. A page whose fetch fails keeps its
previous version; a page the site no longer has (404, 410, no longer listed or linked) is
removed. `scheduler.py` starts the runs of sources with a schedule.
"""
