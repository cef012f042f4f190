"""Backends for lookahead's engine. Each adapter imports its backend lazily."""
