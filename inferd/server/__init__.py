"""The OpenAI-compatible HTTP server: `create_app(engine, ServerSettings(...))` in `app.py`,
run by `inferd serve`."""
