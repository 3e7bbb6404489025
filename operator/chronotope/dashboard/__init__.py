"""The operator's read-only dashboard: a static page and the state it polls."""
