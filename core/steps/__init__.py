"""A connector's steps: filter, transform and route (docs/transforms.md)."""
