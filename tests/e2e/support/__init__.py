"""Helpers for the inferwatch end-to-end tests: agent processes, OTLP sinks, config files."""
