"""Fit verdicts for files on the Hub, with the model picker's own memory rule. Qt-free.

A file already in the cache is judged from its header (`read_model_info`); any other
from the Hub's summary (parameters, architecture, context) or, failing that, from its
size and quantization (`engine.hub.fit`). Either way the bytes needed come from
`ModelInfo.memory_needed` on the backend that would run the model, so the Get models
view and the picker never disagree.
"""

from pathlib import Path

from engine.hub.files import GGUFChoice, RepoFiles
from engine.hub.fit import FITS, TIGHT, WONT_FIT, Fit, estimated_kv_bytes_per_token, estimated_parameters, judge
from engine.model_info import ModelInfo, format_bytes
from engine.models import SUPPORTED_ARCHITECTURES

UNKNOWN_CONTEXT = 1 << 20  # no header: the chosen context length is what counts


def estimated_info(repo: RepoFiles, choice: GGUFChoice) -> ModelInfo:
    """What the picker would know about `choice`, estimated from what the Hub says before a download."""
    parameters = repo.parameters or estimated_parameters(choice)
    return ModelInfo(
        path=Path(choice.path),
        name=choice.name,
        architecture=repo.architecture or "?",
        parameters=parameters,
        quantization=choice.quant,
        file_size=choice.size,
        context_length=repo.context_length or UNKNOWN_CONTEXT,
        weight_bytes_f32=4 * parameters,
        kv_bytes_per_token=estimated_kv_bytes_per_token(parameters),
    )


def fit_for(info: ModelInfo, n_ctx: int, available: int, backend: str, estimated: bool) -> Fit:
    """The verdict for the model `info` describes, at `n_ctx` positions on `backend`.

    An architecture Sprig cannot run never fits, whatever its size.
    """
    fit = judge(info.memory_needed(n_ctx, backend), available, estimated)
    if info.architecture != "?" and info.architecture not in SUPPORTED_ARCHITECTURES:
        return Fit(WONT_FIT, fit.needed, available, estimated)
    return fit


def fit_text(fit: Fit, architecture: str) -> str:
    """The verdict in words: "fits — needs 2.9 GB of 12 GB free (estimated)"."""
    if architecture != "?" and architecture not in SUPPORTED_ARCHITECTURES:
        return f"won't run — Sprig cannot run {architecture} models yet"
    how = {FITS: "fits", TIGHT: "tight", WONT_FIT: "won't fit"}[fit.level]
    estimate = " (estimated)" if fit.estimated else ""
    return f"{how} — needs {format_bytes(fit.needed)} of {format_bytes(fit.available)} free{estimate}"
