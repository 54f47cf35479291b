"""The vLLM plugin (paged_attention_ext.integrations.vllm_plugin) against a stand-in `vllm`
package written to a temporary folder: vllm/_custom_ops.py with ops that are missing, stubs
raising NotImplementedError, calls of unregistered torch ops, or working; vllm/plugins with a
loader that, like vLLM's load_general_plugins, calls every `vllm.general_plugins` entry point.
No real vLLM is involved (none is installed here).

The entry point comes from the package's real metadata: setuptools' own metadata build of this
checkout (the dist-info a `pip install` writes), so a wrong group or target fails these tests."""

import importlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from paged_attention_ext import reference
from paged_attention_ext.tools import testing
from paged_attention_ext.integrations import vllm_compat, vllm_plugin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUP = "vllm.general_plugins"  # the group vLLM's plugin loader reads

# vllm/plugins/__init__.py of the stand-in: vLLM's loader reduced to what a plugin sees (every
# entry point of the group loaded and called, in this process).
STAND_IN_LOADER = f'''
from importlib.metadata import entry_points


def load_general_plugins():
    for plugin in entry_points(group="{GROUP}"):
        plugin.load()()
'''

MISSING = ""  # an op name absent from _custom_ops
STUBS = {
    "bare": "def {name}(*args, **kwargs):\n    raise NotImplementedError\n",
    "message and docstring": textwrap.dedent('''\
        def {name}(out, *args, **kwargs) -> None:
            """Not ported yet."""
            raise NotImplementedError(f"{{__name__}}: {name} is not ported")
        '''),
}
UNREGISTERED = textwrap.dedent('''\
    def {name}(*args):
        torch.ops._C_not_built_here.{name}(*args)
    ''')
WORKING = {
    # vLLM's own style: a wrapper around a registered torch op.
    "wrapper of a registered op": "def {name}(*args):\n    return torch.ops.aten.zeros(*args)\n",
    # More than one statement, even if one of them raises NotImplementedError.
    "raises only on some inputs": textwrap.dedent('''\
        def {name}(out, *args):
            if out is None:
                raise NotImplementedError
            out.zero_()
        '''),
    "another exception": "def {name}(*args):\n    raise RuntimeError('no kernel for this dtype')\n",
    # A wrapper may route the call elsewhere; inspect would show the wrapped stub's source.
    "a wrapped stub": textwrap.dedent('''\
        def _{name}(*args):
            raise NotImplementedError


        {name} = functools.wraps(_{name})(lambda *args: None)
        '''),
    "a torch op object": "{name} = torch.ops.aten.zeros\n",
    "a lambda": "{name} = lambda *args: None  # noqa: E731\n",
}


def custom_ops_source(ops):
    """vllm/_custom_ops.py defining each op name with its template (MISSING: not defined)."""
    return "import functools\n\nimport torch\n\n" + "\n".join(template.format(name=name)
                                          for name, template in ops.items())


def write_stand_in_vllm(folder, ops, custom_ops_prefix=""):
    package = os.path.join(folder, "vllm")
    os.makedirs(os.path.join(package, "plugins"))
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write('"""Stand-in vllm for tests."""\n')
    with open(os.path.join(package, "_custom_ops.py"), "w") as f:
        f.write(custom_ops_prefix + custom_ops_source(ops))
    with open(os.path.join(package, "plugins", "__init__.py"), "w") as f:
        f.write(STAND_IN_LOADER)


def forget_vllm():
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture
def stand_in_vllm(tmp_path, monkeypatch):
    """stand_in_vllm(ops, custom_ops_prefix="") -> the stand-in's vllm._custom_ops module."""
    forget_vllm()
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(ops, custom_ops_prefix=""):
        write_stand_in_vllm(str(tmp_path), ops, custom_ops_prefix)
        importlib.invalidate_caches()
        return importlib.import_module("vllm._custom_ops")

    yield make
    forget_vllm()


@pytest.fixture(scope="module")
def package_metadata(tmp_path_factory):
    """A folder holding the dist-info setuptools builds for this checkout (what `pip install`
    writes, entry_points.txt included); on sys.path it makes importlib.metadata see it."""
    build = tmp_path_factory.mktemp("metadata-build")
    env = dict(os.environ, PAGED_ATTN_BUILD_CUDA="0")
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.prepare_metadata_for_build_editable(sys.argv[1]))", str(build)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    dist_info = result.stdout.strip().splitlines()[-1]
    folder = tmp_path_factory.mktemp("site")
    shutil.copytree(build / dist_info, folder / dist_info)
    return folder


def test_metadata_declares_the_plugin_in_vllms_group(package_metadata):
    dist, = importlib.metadata.distributions(path=[str(package_metadata)])
    assert dist.metadata["Name"] == "paged_attention_ext"
    plugins = [ep for ep in dist.entry_points if ep.group == GROUP]
    assert [ep.value for ep in plugins] == ["paged_attention_ext.integrations.vllm_plugin:register"]
    assert plugins[0].load() is vllm_plugin.register
    # The name VLLM_PLUGINS (vLLM's allow-list) matches; docs/INTEGRATIONS.md gives it.
    assert plugins[0].name == "paged_attention_ext"


@pytest.mark.parametrize("how", ["missing", *STUBS, "unregistered torch op"])
def test_unusable_ops_are_replaced_by_ours(stand_in_vllm, caplog, how):
    template = {"missing": MISSING, "unregistered torch op": UNREGISTERED, **STUBS}[how]
    custom_ops = stand_in_vllm({name: template for name in vllm_plugin.REPLACED_OPS})
    with caplog.at_level(logging.INFO, logger=vllm_plugin.logger.name):
        replaced = vllm_plugin.register()
    assert sorted(replaced) == sorted(vllm_plugin.REPLACED_OPS)
    for name in vllm_plugin.REPLACED_OPS:
        ours = getattr(vllm_compat, name)
        if how == "unregistered torch op":  # settles at the first call (next tests)
            assert getattr(custom_ops, name).__wrapped__ is ours
        else:
            assert getattr(custom_ops, name) is ours
        assert any(f"vllm._custom_ops.{name} was {replaced[name]}" in r.getMessage()
                   for r in caplog.records), caplog.text
    expected_reason = {"missing": "missing", "unregistered torch op": "a call of torch.ops."
                       "_C_not_built_here.paged_attention_v1, which is not registered"}.get(
                           how, "a NotImplementedError stub")
    assert replaced["paged_attention_v1"] == expected_reason


@pytest.mark.parametrize("how", list(WORKING))
def test_working_ops_are_left_alone(stand_in_vllm, how):
    custom_ops = stand_in_vllm({name: WORKING[how] for name in vllm_plugin.REPLACED_OPS})
    before = {name: getattr(custom_ops, name) for name in vllm_plugin.REPLACED_OPS}
    assert vllm_plugin.register() == {}
    assert {name: getattr(custom_ops, name) for name in vllm_plugin.REPLACED_OPS} == before


def test_only_the_holes_are_filled_and_a_second_call_changes_nothing(stand_in_vllm):
    custom_ops = stand_in_vllm({"paged_attention_v1": MISSING,
                                "paged_attention_v2": STUBS["bare"],
                                "reshape_and_cache": WORKING["wrapper of a registered op"],
                                "reshape_and_cache_flash": WORKING["wrapper of a registered op"]})
    own_reshape_and_cache = custom_ops.reshape_and_cache
    assert vllm_plugin.register() == {"paged_attention_v1": "missing",
                                      "paged_attention_v2": "a NotImplementedError stub"}
    assert custom_ops.paged_attention_v1 is vllm_compat.paged_attention_v1
    assert custom_ops.paged_attention_v2 is vllm_compat.paged_attention_v2
    assert custom_ops.reshape_and_cache is own_reshape_and_cache
    assert vllm_plugin.register() == {}  # idempotent
    assert custom_ops.paged_attention_v2 is vllm_compat.paged_attention_v2


def test_an_op_registered_after_the_plugin_ran_is_vllms_own(stand_in_vllm, caplog):
    """Plugins run in no set order: a platform's plugin may register the torch op vLLM's wrapper
    calls after ours ran. The first call then runs vLLM's own op."""
    namespace = "paged_attn_plugin_test_late"
    custom_ops = stand_in_vllm({"paged_attention_v1": UNREGISTERED.replace(
        "_C_not_built_here", namespace)})
    assert vllm_plugin.register() == {"paged_attention_v1": f"a call of torch.ops.{namespace}."
                                      "paged_attention_v1, which is not registered",
                                      "paged_attention_v2": "missing",
                                      "reshape_and_cache": "missing",
                                      "reshape_and_cache_flash": "missing"}
    library = torch.library.Library(namespace, "DEF")  # the late plugin
    library.define("paged_attention_v1(Tensor(a!) out) -> ()")

    def vllms_own_kernel(out):
        out.fill_(7.0)

    library.impl("paged_attention_v1", vllms_own_kernel, "CPU")
    out = torch.zeros(3)
    with caplog.at_level(logging.INFO, logger=vllm_plugin.logger.name):
        custom_ops.paged_attention_v1(out)
        custom_ops.paged_attention_v1(out)
    assert out.tolist() == [7.0, 7.0, 7.0]
    assert caplog.text.count("runs vLLM's own op") == 1  # decided once
    assert vllm_plugin.register() == {}  # idempotent: the wrapper counts as ours


def test_replaced_ops_compute_what_the_oracle_computes(stand_in_vllm, paged_ops):
    custom_ops = stand_in_vllm({name: STUBS["message and docstring"]
                                for name in vllm_plugin.REPLACED_OPS})
    vllm_plugin.register()
    # vLLM's positional call (PagedAttention.forward_decode), tensor scales, fp8 cache.
    seq_lens = [5, 600, 33]
    inputs = testing.make_attention_inputs(3, 8, 2, 64, 16, seq_lens, dtype=torch.bfloat16,
                                           kv_cache_dtype="fp8", seed=17, scale_as_tensor=True)
    expected = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs))
    actual = testing.call_v2(custom_ops.paged_attention_v2, inputs,
                             testing.alloc_v2_outputs(inputs))
    testing.assert_v2_matches(actual, expected, seq_lens, torch.bfloat16, "fp8")
    expected_v1 = testing.call_v1(reference.paged_attention_v1, inputs,
                                  testing.alloc_v1_outputs(inputs))
    actual_v1 = testing.call_v1(custom_ops.paged_attention_v1, inputs,
                                testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(actual_v1, expected_v1, torch.bfloat16, "fp8")

    key, value = torch.randn(2, 7, 2, 64).to(torch.bfloat16)
    slots = torch.tensor([3, -1, 40, 17, 2, 63, 8])
    key_cache = torch.full((4, 2, 8, 16, 8), float("nan"), dtype=torch.bfloat16)
    value_cache = torch.full((4, 2, 64, 16), float("nan"), dtype=torch.bfloat16)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    reference.reshape_and_cache(key, value, expected_k, expected_v, slots, "auto", 1.0, 1.0)
    custom_ops.reshape_and_cache(key, value, key_cache, value_cache, slots, "auto", 1.0, 1.0)
    assert torch.equal(key_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), expected_v.view(torch.uint8))
    assert not key_cache.isnan().all()  # something was written

    # reshape_and_cache_flash as vLLM's V1 backends call it: key with CUDA-graph padding rows
    # past slot_mapping's length, tensor scales, fp8, the K and V halves of one combined
    # [num_blocks, 2, block_size, kv_heads, head_size] tensor.
    key, value = (torch.randn(2, 9, 2, 64) * 3).to(torch.bfloat16)
    key[:, 7:] = float("nan")
    kv = torch.full((4, 2, 16, 2, 64), 0x7F, dtype=torch.uint8)  # the fp8 NaN byte
    expected = kv.clone()
    args = (slots, "fp8", torch.tensor(0.5), torch.tensor(1.5))
    reference.reshape_and_cache_flash(key, value, expected[:, 0], expected[:, 1], *args)
    custom_ops.reshape_and_cache_flash(key, value, kv[:, 0], kv[:, 1], *args)
    assert torch.equal(kv, expected) and not torch.equal(kv, torch.full_like(kv, 0x7F))


def test_a_vllm_that_fails_to_import_gets_a_warning_not_an_error(stand_in_vllm, caplog):
    with pytest.raises(ImportError):
        stand_in_vllm({}, custom_ops_prefix="import vllm._C  # not built\n")
    with caplog.at_level(logging.WARNING, logger=vllm_plugin.logger.name):
        assert vllm_plugin.register() == {}
    assert "vLLM plugin not applied (ModuleNotFoundError" in caplog.text


def test_when_our_ops_cannot_serve_vllm_keeps_its_own(stand_in_vllm, monkeypatch, caplog):
    custom_ops = stand_in_vllm({"paged_attention_v1": MISSING,
                                "paged_attention_v2": STUBS["bare"],
                                "reshape_and_cache": STUBS["bare"],
                                "reshape_and_cache_flash": STUBS["bare"]})
    stub = custom_ops.paged_attention_v2
    # None in sys.modules makes `import` of that module raise ImportError.
    monkeypatch.setitem(sys.modules, "paged_attention_ext.integrations.vllm_compat", None)
    monkeypatch.delattr("paged_attention_ext.integrations.vllm_compat", raising=False)
    with caplog.at_level(logging.WARNING, logger=vllm_plugin.logger.name):
        assert vllm_plugin.register() == {}
    assert "vLLM plugin not applied (ModuleNotFoundError" in caplog.text
    assert not hasattr(custom_ops, "paged_attention_v1")
    assert custom_ops.paged_attention_v2 is stub


# A vLLM worker: a fresh process that loads the plugins the way vLLM does, then runs the ops.
WORKER = textwrap.dedent('''\
    import torch
    import vllm.plugins
    from vllm import _custom_ops as ops

    from paged_attention_ext import reference
    from paged_attention_ext.tools import testing

    vllm.plugins.load_general_plugins()
    for name in ("paged_attention_v1", "paged_attention_v2", "reshape_and_cache",
                 "reshape_and_cache_flash"):
        print(name, getattr(ops, name).__module__)

    seq_lens = [1, 530, 77, 1100]
    inputs = testing.make_attention_inputs(4, 12, 4, 32, 8, seq_lens, dtype=torch.float16,
                                           use_alibi=True, seed=23, noncontig_query=True)
    expected = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs))
    actual = testing.call_v2(ops.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs))
    testing.assert_v2_matches(actual, expected, seq_lens, torch.float16)
    expected_v1 = testing.call_v1(reference.paged_attention_v1, inputs,
                                  testing.alloc_v1_outputs(inputs))
    out = testing.call_v1(ops.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(out, expected_v1, torch.float16)

    key, value = torch.randn(2, 5, 4, 32).half()
    key_cache, value_cache = inputs.key_cache.clone(), inputs.value_cache.clone()
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    slots = torch.tensor([0, 9, -1, 30, 4])
    reference.reshape_and_cache(key, value, expected_k, expected_v, slots, "auto", 1.0, 1.0)
    ops.reshape_and_cache(key, value, key_cache, value_cache, slots, "auto", 1.0, 1.0)
    assert torch.equal(key_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), expected_v.view(torch.uint8))
    print("worker ok")
''')


def test_a_worker_process_loading_plugins_gets_our_ops(tmp_path, package_metadata):
    vllm_folder = tmp_path / "stand-in"
    write_stand_in_vllm(str(vllm_folder), {"paged_attention_v1": MISSING,
                                           "paged_attention_v2": STUBS["message and docstring"],
                                           "reshape_and_cache": UNREGISTERED,
                                           "reshape_and_cache_flash": MISSING})
    # The metadata folder first: its paged_attention_ext distribution shadows any installed one,
    # so the entry points seen are the ones this checkout declares.
    path = [str(package_metadata), str(vllm_folder), ROOT]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", WORKER], cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for name in vllm_plugin.REPLACED_OPS:
        assert f"{name} {vllm_compat.__name__}" in lines, result.stdout
    assert lines[-1] == "worker ok"
