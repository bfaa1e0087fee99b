"""The browser pages inferd serves: a live view of the engine at /dashboard and a chat page at /.

    routes.py    the pages, their static files, /dashboard/snapshot and /dashboard/events
    sampler.py   the engine snapshots (rate-capped, shared by every page) and the requests
                 that finished lately
    static/      plain HTML, JavaScript and CSS: no build step, nothing fetched from elsewhere

See docs/dashboard.md.
"""

from inferd.server.dashboard.routes import install_dashboard

__all__ = ["install_dashboard"]
