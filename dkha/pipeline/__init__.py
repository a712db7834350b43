"""Declarative pipelines and their report."""
