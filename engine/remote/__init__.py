"""Remote models: chat with any OpenAI-compatible server (llama.cpp, vLLM, SGLang, Ollama, ...).

`endpoints` names the servers and their presets, `keys` keeps their API keys in the
system keyring, `client` streams answers as `GenerationEvent`s, and `errors` turns every
failure into one line a person can act on. Qt-free, like all of `engine`.
"""
