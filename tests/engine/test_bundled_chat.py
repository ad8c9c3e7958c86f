"""Each bundled model answers a question in its own chat format and stops by itself."""

import pytest

from engine.bundled import bundled_model
from engine.chat_session import ChatSession
from engine.generation import FINISH_STOP_STRING, FINISH_STOP_TOKEN
from engine.loader import load_model
from engine.sampling import SamplingParams

# Turn markers of the chat formats in use (Gemma, ChatML, Llama 3, Llama 2 / Mistral).
MARKUP = ("<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>",
          "<|eot_id|>", "[INST]", "[/INST]")


@pytest.mark.parametrize("key", ["smollm2", "gemma3"])
def test_bundled_model_answers_without_markup_and_stops(key):
    loaded = load_model(bundled_model(key).path, "numpy")
    try:
        session = ChatSession(loaded, n_ctx=512, params=SamplingParams.greedy(), max_tokens=96)
        events = list(session.send("What is the capital of France?"))
    finally:
        loaded.close()
    answer = "".join(event.text for event in events)
    assert answer.strip()
    assert events[-1].finish_reason in (FINISH_STOP_TOKEN, FINISH_STOP_STRING)
    assert not [marker for marker in MARKUP if marker in answer]
    special = [text for text in loaded.tokenizer.special_tokens if len(text) > 2 and text in answer]
    assert not special
    # The model did not go on to write the user's next turn.
    assert not [line for line in answer.splitlines() if line.strip().lower() in ("user", "model", "assistant")]
