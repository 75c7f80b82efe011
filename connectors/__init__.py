"""One package per connector; each declares itself to core/engine/registry.py in its __init__."""
