"""edge: on-device LLM inference on ONNX Runtime.

Data path: prompt -> tokens (edge.tokenizer) -> decoder steps with an in-place KV cache (edge.model) -> sampling
(edge.sampling) -> text (edge.engine). The public API is `Engine`.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so `import edge` stays cheap for the CLIs and the exporter does not pull in onnxruntime.
    if name in ("Engine", "GenerationConfig"):
        from edge import engine

        return getattr(engine, name)
    raise AttributeError(name)
