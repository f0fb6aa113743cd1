"""`edge-spec serve`: one bundle behind an OpenAI-compatible HTTP server (Starlette + uvicorn, the `serve` extra).

app.py the routes, schema.py request parsing and validation, worker.py the bounded queue and the decode thread,
metrics.py the Prometheus text, command.py the CLI subcommand (imports nothing heavy until it runs).
"""
