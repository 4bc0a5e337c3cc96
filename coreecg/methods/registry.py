"""The method registry, at its documented place: it lives in the config package
(`coreecg.config.method_registry`), so the config reads it without importing this package."""
from coreecg.config.method_registry import METHODS, MethodSpec, declare_method, method_specs, moved_keys

__all__ = ["METHODS", "MethodSpec", "declare_method", "method_specs", "moved_keys"]
