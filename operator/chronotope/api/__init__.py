"""Chronotope's user-facing API: the custom resource models and what is generated from them.

`v1alpha1` holds the pydantic models (one module per kind). `schema` turns
them into structural OpenAPI, `crd` into CustomResourceDefinitions,
`docs` into `docs/api.md`; `annotations` parses the GPU sharing request
from plain pods' annotations. Everything here is pure: it never imports a
Kubernetes client (an import-linter contract enforces it).
"""

__all__: list[str] = []
