"""Tile grids from axis-group tilings, and lowering of tensor ops to tile tasks."""
