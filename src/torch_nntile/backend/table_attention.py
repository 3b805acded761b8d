"""ATen-table rows for torch_nntile:: ops (placeholder, filled by its owner)."""
