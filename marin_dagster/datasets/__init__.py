"""Raw corpora that ship through the package registry (no dataset hub needed)."""
