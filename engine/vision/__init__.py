"""Images: the room where vision models will live. Empty for now; nothing here runs yet.

What goes here, one small module each:

- the projector reader: llama.cpp's `mmproj` GGUF that sits beside a model file (its
  `clip.*` metadata, `clip.projector_type`, the vision tower's tensors), read through
  `engine.gguf_file` as the text model is;
- the encoders: one file per projector family (`clip.projector_type`), each a vision tower
  and its projector written once against the backend contract (`backends/base.py`), as the
  text families in `engine/models/` are, so that every backend runs it;
- preprocessing: the Hugging Face processor's resizing, normalisation and placeholder
  expansion reproduced exactly (its numbers are the tests' reference);
- the image embeddings' cache, keyed by the image's content hash, so that the KV prefix of
  a conversation survives its next turn.

How it plugs in: `engine.opening` finds the projector beside the model and loads an encoder
with it; the chat session renders the template with image placeholders, and the prefill
takes the encoder's embeddings in their place (the forward pass's `embed` step,
`engine.models.common.Transformer.embed`). The app and the server only hand over images.
"""
