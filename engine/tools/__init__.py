"""Tool use: the room where tool calling will live. Empty for now; nothing here runs yet.

What goes here:

- tool-call formats: a parser (the model's output to calls) and a renderer (calls and their
  results back into the prompt) per format, one module each: Hermes / Qwen JSON, Qwen3.5
  XML, Harmony (gpt-oss), Llama, Mistral, ...; the two the server parses today
  (`engine.server.tool_calls`) and Harmony's channels (`engine.harmony`) move here;
- MCP: tools from MCP servers, through the `mcp` SDK;
- built-ins: the few tools Sprig offers itself.

How it plugs in: a chat session asks this package which format its model speaks (from the
template and the vocabulary), renders the available tools into the prompt with the chat
template's `tools`, parses each answer for calls, and hands every call to the caller: the
app shows it to the user and runs it only with their consent; the server returns it to the
client (OpenAI's `tool_calls`). Nothing here imports Qt.
"""
