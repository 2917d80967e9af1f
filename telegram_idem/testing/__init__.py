"""Test helpers for bot authors."""
