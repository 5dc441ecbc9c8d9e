"""Tools for multi-turn agent loops, and the local code sandbox they run untrusted code in."""
