"""The local HTTP server (FastAPI on uvicorn): one model, one scheduler, a module per protocol.

- Protocols, each a `router(state)` of its routes and its answers:
  `openai` (OpenAI's /v1 chat, completions, embeddings, models). Anthropic Messages
  (`anthropic.py`) and Ollama (`ollama.py`) join as siblings: each plans its requests
  through `completions` and runs them on the scheduler like `openai` does, and is included
  by `app.create_app` beside it.
- The shared core: `scheduler` (the one thread that owns the model and batches every
  request's decode steps), `completions` (a checked request to a generation on the
  scheduler, and its events back), `state` (the served model and the counters), `options`
  (sampling options, log-probabilities), `constrained` (llguidance masks), `tool_calls`,
  `schemas` (request bodies).
- Around them: `app` (the ASGI application: the protocols' routes, /health, /metrics,
  /tokenize, the middleware), `security`, `errors` (OpenAI's error shape, which every
  route answers with today: a protocol with shapes of its own maps them for its routes),
  `metrics`, `serve` (running it).
"""
