"""Plug-ins that run radixlink inside serving engines (SGLang, vLLM; see docs/integrations.md).

Nothing else in radixlink imports this package; each engine is imported only by its own modules.
"""
