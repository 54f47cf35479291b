"""What the tests share: helpers, never tests. No test module imports another test module.
  backend_params   the backends a conformance test runs on, and making one the one that runs
  cache_writes     reshape_and_cache(_flash) cases
  dense_reference  float64 dense attention (the oracle's own check)
  blocksparse      blocksparse cases, the definition's mask, NaN-poisoning of skipped blocks
  fatbin           the CUDA images a shared library holds
  host_cpp         builds small host C++ programs over csrc/ headers
  op_calls         calling the ops the ways callers do
"""
