"""The local OpenAI-compatible HTTP server (FastAPI on uvicorn).

Modules: `scheduler` (the one thread that owns the model), `app` (routes), `completions`
(requests to generations and back), `schemas`, `security`, `errors`, `constrained`
(llguidance masks), `tool_calls`, `metrics`, `serve` (running it).
"""
