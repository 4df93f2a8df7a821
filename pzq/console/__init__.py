"""The web console, a process of its own (``pzq console``): an ASGI app (Starlette, served by uvicorn,
pages from Jinja2 templates) that talks to pzq only through its monitor socket. server.py runs it,
reader.py polls STATS and caches the on-demand reads, history.py keeps 15 minutes for the charts,
views.py makes each page's data (and JSON twin), render.py the HTML, app.py the routes, actions.py the
changes, auth.py the logins, guard.py the Host check and security headers. Only the CLI imports it."""
