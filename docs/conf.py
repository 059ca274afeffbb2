"""Sphinx configuration for the kai-session-checkpoint-policy documentation."""

from __future__ import annotations

project = "kai-session-checkpoint-policy"
author = "kai-session-checkpoint-policy developers"
copyright = "the kai-session-checkpoint-policy developers"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "examples"]

myst_heading_anchors = 3
myst_enable_extensions = ["deflist"]

html_theme = "alabaster"
html_title = "kai-session-checkpoint-policy"
html_theme_options = {"description": "Semantic durability checkpoints for persisted LLM agents"}
