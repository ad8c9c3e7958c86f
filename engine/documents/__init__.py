"""Documents: the room where chatting with one's files will live. Empty for now; nothing here
runs yet.

What goes here, one small module each:

- extraction: text out of PDF, HTML, Markdown, office files and plain text, with where each
  passage came from (file, page, heading);
- the index: passages cut into chunks, kept in SQLite with FTS5 for words and vectors for
  meaning; the vectors from embedding models run on our own engine (`engine.embedding`);
- retrieval: hybrid search (FTS5 and vectors, ranks fused) and citations that point back
  to the passage.

How it plugs in: the app (or the server) adds files to an index; before a turn, the chat
session asks retrieval for the passages that fit the question and puts them in the prompt
with their citations; the answer's citations link back to the passages.
"""
