"""Models from the Hugging Face Hub: find, check the fit, download, resume, verify.

Built on `huggingface_hub`, into its standard cache (shared with llama.cpp and other
tools, so nothing is downloaded twice). Qt-free, like all of `engine`:

- `connection`: the cache, the token, offline mode, retries, and the Hub's errors in words;
- `search`: recommended starting points (offline too) and search of GGUF repositories;
- `files`: a repository's GGUF files grouped by quantization (split files as one model);
- `fit`: whether a file fits this machine, before anything is downloaded;
- `download`: resumable downloads, checked against the Hub's SHA-256, into the cache;
- `cache`: what is downloaded, and deleting a download;
- `tokens`: the access token for gated repositories, in the system keyring.
"""
