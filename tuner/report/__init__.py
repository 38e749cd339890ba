"""Present results: terminal tables and JSON."""
