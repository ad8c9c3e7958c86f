"""Widgets of the chat window: the conversation view and its messages."""
