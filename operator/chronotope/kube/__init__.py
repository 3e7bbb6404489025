"""The one package that talks to the Kubernetes API server.

Everything else hands plain data to functions here; no other layer imports
the `kubernetes` client (enforced by import-linter).
"""
