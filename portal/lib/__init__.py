"""Plain helpers shared by several apps; nothing here knows about a particular model."""
