"""`sprig pull owner/name[:QUANT]` and `python -m engine pull ...`: a model from the Hub, from a terminal.

The same steps as the app's Get models view: list the repository's GGUF files, pick one,
check the disk, download with resume, verify the SHA-256, and print the local path.
Without `:QUANT` the pick is Q4_K_M, or the repository's only model.
"""

import getpass
import sys
import threading
from pathlib import Path

from tqdm import tqdm

from engine.errors import DownloadPaused, HubError
from engine.hub import tokens
from engine.hub.connection import Hub
from engine.hub.download import Pull, bytes_on_disk, download
from engine.hub.files import DEFAULT_QUANT, GGUFChoice, RepoFiles, list_gguf_files


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'owner/name:Q4_K_M' as ('owner/name', 'Q4_K_M'); the quantization is optional."""
    repo_id, _, quant = spec.partition(":")
    return repo_id.strip(), quant.strip() or None


def choose(repo: RepoFiles, quant: str | None) -> GGUFChoice:
    """The choice named `quant`, else Q4_K_M, else the only one; raises HubError listing the choices."""
    choice = repo.find(quant or DEFAULT_QUANT)
    if choice is None and quant is None and len(repo.choices) == 1:
        choice = repo.choices[0]
    if choice is None:
        listed = ", ".join(f"{repo.repo_id}:{c.quant} ({c.size / 1e9:.2f} GB)" for c in repo.choices)
        asked = f"no {quant} file" if quant else f"no {DEFAULT_QUANT} file and several others"
        raise HubError(f"{repo.repo_id} has {asked}; name one of: {listed}.")
    return choice


def pull_in_terminal(spec: str, cache_dir: Path | None = None, ask_token: bool = False) -> Path:
    """Download `spec` with a progress bar on stderr; return the model's local path.

    `ask_token` first asks for an access token (not echoed) and keeps it in the keyring.
    """
    if ask_token:
        tokens.save_token(getpass.getpass("Hugging Face access token (kept in the system keyring): "))
    hub = Hub(token=tokens.stored_token()) if cache_dir is None else Hub(cache_dir, token=tokens.stored_token())
    repo_id, quant = parse_spec(spec)
    repo = list_gguf_files(hub, repo_id)
    pull = Pull.of(repo, choose(repo, quant))
    already = bytes_on_disk(hub.cache_dir, pull)
    print(f"{pull.label}: {pull.choice.name}, {pull.choice.size / 1e9:.2f} GB", file=sys.stderr)
    cancel = threading.Event()
    with tqdm(total=pull.choice.size, initial=already, unit="B", unit_scale=True, file=sys.stderr) as bar:
        try:
            for progress in download(hub, pull, cancel):
                bar.update(progress.done - bar.n)
                bar.set_postfix_str(progress.stage)
        except KeyboardInterrupt:
            raise DownloadPaused(
                f"Interrupted: {bar.n / 1e6:.0f} MB are kept; run the same command again to resume."
            ) from None
    assert progress.path is not None  # download's last progress carries the path
    return progress.path
