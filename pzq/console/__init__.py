"""The web console (``--http-dsn``): pages.py renders, history.py remembers the last 15 minutes,
web.py serves them from a thread that only reads what the loop publishes."""
