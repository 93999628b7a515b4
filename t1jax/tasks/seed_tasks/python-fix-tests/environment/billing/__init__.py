"""Billing helpers."""
