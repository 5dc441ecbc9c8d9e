"""Parts whose interface may still change (verl keeps its agent loops here too)."""
