"""Models and layers for nntile users."""
