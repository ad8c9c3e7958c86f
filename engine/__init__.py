"""Sprig's inference engine: model files, tokenizer, chat templates and generation.

This package never imports Qt.
"""
