"""Serving: `subic serve` (HTTP app, sockets), and the SavedModel and
LiteRT exports that TF Serving and devices run.

A new route goes in `http_app.py`, a new export format in `export.py`.
"""
