"""Sphinx configuration of the OpenReg integration guide (MyST Markdown, default alabaster theme)."""

project = "OpenReg"
author = "OpenReg contributors"
copyright = "OpenReg contributors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Explicit targets such as ``(fallback-views)=`` are what chapters link to.
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "OpenReg: an accelerator integration guide"
