"""Triage of a finished run: failing cases grouped into causes, their wire evidence, declarations written from them."""
