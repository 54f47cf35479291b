"""The tools around the library: the `paged-attn` command (cli: info, check, bench), backend
detection, the conformance check against the oracle, the benchmark harness, the test inputs and
the build's CUDA arch resolution. The library (api, reference, fallback, validation, core,
schemas, integrations) never imports from here (tests/test_layering.py)."""
