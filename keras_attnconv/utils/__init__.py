"""Helpers below everything else of the package (it imports nothing of the package): argument checks, safe files,
the owners' marks, staging, reports, the console."""
