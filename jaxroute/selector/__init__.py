"""selector."""
