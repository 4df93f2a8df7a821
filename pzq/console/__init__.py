"""The web console (``--http-dsn``): pages.py renders, history.py remembers the last 15 minutes,
state.py holds what the loop publishes, handler.py answers requests from threads that only read that,
listener.py keeps the connection limits, auth.py the logins, and web.py puts them together. Only the
CLI imports this package; the server knows it through pzq.endpoints.console.WebConsole."""
