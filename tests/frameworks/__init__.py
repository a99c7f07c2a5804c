"""Real agent frameworks with their real instrumentation against a scripted model server on loopback."""
