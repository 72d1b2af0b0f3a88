"""Shared test helpers (real-component fixtures)."""
