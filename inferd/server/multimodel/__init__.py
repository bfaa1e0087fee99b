"""Many models behind one server (`inferd serve --model NAME=PATH ... | --models-dir DIR`).

Each loaded model is the very app a single-model server runs (server/app.py: its own engine
client and core processes, tokenizer, templates, metrics, admission); the dispatcher
(dispatcher.py) reads a request's `model`, has the pool (pool.py) load that model's app when
it is not loaded, unloading the least recently used idle ones when `--max-loaded-models` or
`--max-loaded-memory` needs room (memory.py: what a model counts), unloading a model idle past
its keep-alive (`--idle-unload`, Ollama's `keep_alive`: keep_alive.py), and forwards the
request to it. Routes about the server rather than a model (/v1/models,
/api/tags, /api/ps, /health, /metrics, /version) are the dispatcher's own.
"""
