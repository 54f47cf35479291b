"""`paged-attn bench`: decode-attention benchmark (docs/PERFORMANCE.md describes the method).

presets.py (shapes) -> workload.py (paged inputs, bytes) -> contenders.py (what is raced) ->
timing.py / bandwidth.py / memory.py (measurements) -> runner.py (one run) -> report.py /
plot.py (output); machine.py and progress.py serve the report and the live display.
"""
