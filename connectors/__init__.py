"""One package per connector; each declares itself to core/registry.py in its __init__."""
